from __future__ import annotations

import re
from pathlib import Path

import pytest

from pin_identity.config import ConfigurationError, load_settings, variables

OPERATORS = Path(__file__).resolve().parents[2] / "docs" / "operators.md"
# Read by the embedded broker's launcher itself, which the tests start without settings.
OUTSIDE_THE_TREE = {"PIN_IDENTITY_EMBEDDED_KAFKA_JVM_OPTIONS"}


def test_defaults_follow_the_contract(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (
        "PIN_IDENTITY_FANOUT_BATCH_SIZE",
        "PIN_IDENTITY_INLINE_FANOUT_THRESHOLD",
        "PIN_IDENTITY_DEBUG",
        "PIN_IDENTITY_RELAY_SESSION_TIMEOUT_S",
        "PIN_IDENTITY_OUTBOX_RELAY_CREATES_TOPICS",
    ):
        monkeypatch.delenv(name, raising=False)
    settings = load_settings(_env_file=None)
    assert (settings.fanout.polling_interval_s, settings.fanout.batch_size, settings.fanout.max_lease_s) == (
        5,
        500,
        300,
    )
    assert (settings.fanout.max_attempts, settings.inline_fanout_threshold) == (5, 200)
    assert (settings.imports.page_lease_s, settings.imports.max_page_attempts) == (600, 5)
    assert settings.talent_import_mode == "api-pull"
    assert settings.worker_http_port == 9464
    assert settings.kafka_topic_partitions == 12
    assert settings.debug is False
    # A standby takes over from a relay whose path went silent within this plus its 2 s look: under 30 s.
    assert settings.relay.session_timeout_s == 15
    assert settings.outbox_relay_creates_topics is True


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("PIN_IDENTITY_FANOUT_BATCH_SIZE", "many"),
        ("PIN_IDENTITY_FANOUT_BATCH_SIZE", "0"),
        ("PIN_IDENTITY_FANOUT_MAX_ATTEMPTS", "-1"),
        ("PIN_IDENTITY_FANOUT_POLLING_INTERVAL_S", "0"),
        ("PIN_IDENTITY_TALENT_IMPORT_MODE", "pull"),
        ("PIN_IDENTITY_WORKER_HTTP_PORT", "70000"),
        ("PIN_IDENTITY_KAFKA_CONFIG", "{not json"),
        ("PIN_IDENTITY_KAFKA_CONFIG", "[1, 2]"),
        ("PIN_IDENTITY_DEBUG", "maybe"),
        ("PIN_IDENTITY_RELAY_SESSION_TIMEOUT_S", "0.5"),
        ("PIN_IDENTITY_OUTBOX_RELAY_CREATES_TOPICS", "sometimes"),
        # A wait of 0 where it is a loop's pause: a busy loop.
        ("PIN_IDENTITY_RELAY_IDLE_WAIT_S", "0"),
        ("PIN_IDENTITY_RELAY_STANDBY_WAIT_S", "0"),
        ("PIN_IDENTITY_TALENT_SYNC_POLL_TIMEOUT_S", "0"),
    ],
)
def test_a_bad_value_is_one_line_naming_its_variable(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigurationError) as raised:
        load_settings(_env_file=None)
    message = str(raised.value)
    assert message.startswith(f"{variable}:")
    assert "\n" not in message


def test_kafka_config_passes_librdkafka_properties(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(
        "PIN_IDENTITY_KAFKA_CONFIG", '{"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN"}'
    )
    assert load_settings(_env_file=None).kafka_properties == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "PLAIN",
    }


def test_the_configuration_table_lists_every_variable_of_the_settings_tree_and_no_other() -> None:
    section = OPERATORS.read_text(encoding="utf-8").split("## Configuration", 1)[1].split("\n## ", 1)[0]
    first_cells = re.findall(r"^\| ([^|]+) \|", section, re.M)
    listed = {name for cell in first_cells for name in re.findall(r"`(PIN_IDENTITY_[A-Z_]+)`", cell)}
    assert listed - OUTSIDE_THE_TREE == set(variables())


def test_a_section_variable_sets_its_jobs_tunable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIN_IDENTITY_RELAY_BATCH_SIZE", "77")
    monkeypatch.setenv("PIN_IDENTITY_TALENT_SYNC_MAX_DEFERRALS", "3")
    monkeypatch.setenv("PIN_IDENTITY_IMPORT_PLAN_AHEAD_PAGES", "2")
    settings = load_settings(_env_file=None)
    assert (
        settings.relay.batch_size,
        settings.talent_sync.max_deferrals,
        settings.imports.plan_ahead_pages,
    ) == (
        77,
        3,
        2,
    )
    assert settings.fanout.batch_size == 500  # the others keep their defaults


@pytest.mark.parametrize(
    "variable",
    [
        "PIN_IDENTITY_RELAY_IDLE_WAIT_S",
        "PIN_IDENTITY_IMPORT_LOCK_RETRY_S",
        "PIN_IDENTITY_TALENT_SYNC_BATCH_SIZE",
    ],
)
def test_a_bad_section_value_names_its_own_variable(monkeypatch: pytest.MonkeyPatch, variable: str) -> None:
    monkeypatch.setenv(variable, "-1")
    with pytest.raises(ConfigurationError, match=f"^{variable}: "):
        load_settings(_env_file=None)


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"PIN_IDENTITY_RELAY_MAX_BACKOFF_S": "20"}, ["PIN_IDENTITY_RELAY_MAX_BACKOFF_S (20 s)"]),
        ({"PIN_IDENTITY_RELAY_STOP_GRACE_S": "15"}, ["PIN_IDENTITY_RELAY_STOP_GRACE_S (15 s)"]),
        ({"PIN_IDENTITY_RELAY_HEARTBEAT_EVERY_S": "30"}, ["PIN_IDENTITY_RELAY_HEARTBEAT_EVERY_S (30 s)"]),
        (
            {"PIN_IDENTITY_RELAY_SESSION_TIMEOUT_S": "4"},
            ["PIN_IDENTITY_RELAY_SESSION_TIMEOUT_S (4 s)", "transaction coordinator (5 s)"],
        ),
    ],
)
def test_relay_settings_its_session_would_not_outlive_are_refused_naming_both(
    monkeypatch: pytest.MonkeyPatch, values: dict[str, str], named: list[str]
) -> None:
    for variable, value in values.items():
        monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigurationError) as refused:
        load_settings(_env_file=None)
    line = str(refused.value)
    assert "\n" not in line and line.startswith("PIN_IDENTITY_RELAY_SESSION_TIMEOUT_S")
    assert all(name in line for name in named), line


@pytest.mark.parametrize(
    ("url", "allowed", "refused"),
    [
        ("http://talent.internal:8080", "", True),
        ("http://talent.internal:8080", "true", False),
        ("https://talent.internal", "", False),
        ("http://127.0.0.1:8080", "", False),
        ("http://localhost:8080", "", False),
        ("http://[::1]:8080", "", False),
    ],
)
def test_a_token_sent_in_clear_to_another_host_is_refused_unless_allowed(
    monkeypatch: pytest.MonkeyPatch, url: str, allowed: str, refused: bool
) -> None:
    monkeypatch.setenv("PIN_IDENTITY_TALENT_API_URL", url)
    monkeypatch.setenv("PIN_IDENTITY_TALENT_API_TOKEN", "secret-token")
    if allowed:
        monkeypatch.setenv("PIN_IDENTITY_TALENT_API_ALLOW_PLAINTEXT", allowed)
    if not refused:
        assert load_settings(_env_file=None).talent_api_url == url
        return
    with pytest.raises(ConfigurationError, match="PIN_IDENTITY_TALENT_API_ALLOW_PLAINTEXT") as error:
        load_settings(_env_file=None)
    assert "secret-token" not in str(error.value)
