"""Secrets from files: `PIN_IDENTITY_KAFKA_CONFIG_FILE` (whose values may name files) and each
`PIN_IDENTITY_<SECRET>_FILE`. A secret is never part of an error, whatever goes wrong."""

from __future__ import annotations

from pathlib import Path

import pytest

from pin_identity.config import ConfigurationError, Settings, load_settings

SECRET = "s3cr3t-scram-password"


@pytest.fixture(autouse=True)
def _no_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("KAFKA_CONFIG", "KAFKA_CONFIG_FILE", "DATABASE_PASSWORD_FILE", "TALENT_API_TOKEN"):
        monkeypatch.delenv(f"PIN_IDENTITY_{name}", raising=False)


def _file(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_the_config_file_gives_librdkafka_properties_and_reads_a_secret_from_the_file_it_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    password = _file(tmp_path, "relay-password", SECRET + "\n")
    config = _file(
        tmp_path,
        "client.properties",
        "# the relay's principal\n"
        "security.protocol = SASL_SSL\n"
        "sasl.mechanism=SCRAM-SHA-512\n\n"
        "! another comment\n"
        "sasl.username=pin-identity-relay\n"
        f"sasl.password=${{file:{password}}}\n",
    )
    monkeypatch.setenv("PIN_IDENTITY_KAFKA_CONFIG_FILE", str(config))
    monkeypatch.setenv("PIN_IDENTITY_KAFKA_CONFIG", '{"sasl.username": "overridden", "linger.ms": 5}')
    settings = load_settings(_env_file=None)
    assert settings.kafka_properties == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "overridden",  # the variable's over the file's
        "sasl.password": SECRET,  # without the mounted file's line end
        "linger.ms": "5",
    }
    assert SECRET not in repr(settings) and str(config) in repr(settings)


@pytest.mark.parametrize(
    ("properties", "expected"),
    [
        ("security.protocol\n", "PIN_IDENTITY_KAFKA_CONFIG_FILE: {config} line 1 is not `name=value`"),
        (
            "sasl.password=${file:/nowhere/password}\n",
            "PIN_IDENTITY_KAFKA_CONFIG_FILE (sasl.password): cannot read /nowhere/password "
            "(No such file or directory)",
        ),
        (
            "sasl.password=${file:{empty}}\n",
            "PIN_IDENTITY_KAFKA_CONFIG_FILE (sasl.password): {empty} is empty",
        ),
    ],
)
def test_a_config_file_that_cannot_be_used_is_one_line_naming_the_variable_and_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, properties: str, expected: str
) -> None:
    empty = _file(tmp_path, "empty", "")
    config = _file(tmp_path, "client.properties", properties.replace("{empty}", str(empty)))
    monkeypatch.setenv("PIN_IDENTITY_KAFKA_CONFIG_FILE", str(config))
    with pytest.raises(ConfigurationError) as raised:
        load_settings(_env_file=None)
    assert str(raised.value) == expected.format(config=config, empty=empty)


def test_a_missing_config_file_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PIN_IDENTITY_KAFKA_CONFIG_FILE", str(tmp_path / "absent.properties"))
    with pytest.raises(ConfigurationError) as raised:
        load_settings(_env_file=None)
    absent = tmp_path / "absent.properties"
    assert str(raised.value) == (
        f"PIN_IDENTITY_KAFKA_CONFIG_FILE: cannot read {absent} (No such file or directory)"
    )


def test_a_value_of_the_json_variable_may_name_a_file_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    password = _file(tmp_path, "password", SECRET)
    monkeypatch.setenv("PIN_IDENTITY_KAFKA_CONFIG", f'{{"sasl.password": "${{file:{password}}}"}}')
    assert load_settings(_env_file=None).kafka_properties == {"sasl.password": SECRET}


@pytest.mark.parametrize("secret", ["database_password", "talent_api_token", "admin_token"])
def test_each_secret_file_variable_gives_its_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, secret: str
) -> None:
    monkeypatch.setenv(f"PIN_IDENTITY_{secret.upper()}_FILE", str(_file(tmp_path, secret, SECRET + "\r\n")))
    settings = load_settings(_env_file=None)
    assert getattr(settings, secret) == SECRET
    assert SECRET not in repr(settings)


def test_a_secret_both_in_a_variable_and_in_a_file_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PIN_IDENTITY_TALENT_API_TOKEN", SECRET)
    monkeypatch.setenv("PIN_IDENTITY_TALENT_API_TOKEN_FILE", str(_file(tmp_path, "token", SECRET)))
    with pytest.raises(ConfigurationError) as raised:
        load_settings(_env_file=None)
    assert str(raised.value) == (
        "PIN_IDENTITY_TALENT_API_TOKEN and PIN_IDENTITY_TALENT_API_TOKEN_FILE are both set; "
        "keep the file alone"
    )
    assert SECRET not in str(raised.value)


def test_an_unreadable_secret_file_is_named_without_its_content(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError) as raised:
        load_settings(_env_file=None, database_password_file=tmp_path / "absent")
    assert str(raised.value) == (
        f"PIN_IDENTITY_DATABASE_PASSWORD_FILE: cannot read {tmp_path / 'absent'} (No such file or directory)"
    )


def test_the_database_password_reaches_libpq_and_not_the_url_shown(tmp_path: Path) -> None:
    from pin_identity.composition import Container

    password = _file(tmp_path, "pg-password", SECRET)
    settings = Settings(
        database_url="postgresql://pin_identity_relay@db.internal:5432/identity",
        database_password_file=password,
    )
    container = Container(settings)
    assert SECRET not in container.connections.database_url
    assert f"password={SECRET}" in container.connections.database_conninfo
