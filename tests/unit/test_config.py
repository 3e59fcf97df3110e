from __future__ import annotations

import pytest

from pin_identity.config import ConfigurationError, load_settings


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
    assert (settings.fanout_polling_interval_s, settings.fanout_batch_size, settings.fanout_max_lease_s) == (
        5,
        500,
        300,
    )
    assert (settings.fanout_max_attempts, settings.inline_fanout_threshold) == (5, 200)
    assert (settings.import_page_lease_s, settings.import_max_page_attempts) == (600, 5)
    assert settings.talent_import_mode == "api-pull"
    assert settings.worker_http_port == 9464
    assert settings.kafka_topic_partitions == 12
    assert settings.debug is False
    # A standby takes over from a relay whose path went silent within this plus its 2 s look: under 30 s.
    assert settings.relay_session_timeout_s == 15
    assert settings.outbox_relay_creates_topics is True


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("PIN_IDENTITY_FANOUT_BATCH_SIZE", "many"),
        ("PIN_IDENTITY_FANOUT_BATCH_SIZE", "0"),
        ("PIN_IDENTITY_FANOUT_MAX_ATTEMPTS", "-1"),
        ("PIN_IDENTITY_TALENT_IMPORT_MODE", "pull"),
        ("PIN_IDENTITY_WORKER_HTTP_PORT", "70000"),
        ("PIN_IDENTITY_KAFKA_CONFIG", "{not json"),
        ("PIN_IDENTITY_KAFKA_CONFIG", "[1, 2]"),
        ("PIN_IDENTITY_DEBUG", "maybe"),
        ("PIN_IDENTITY_RELAY_SESSION_TIMEOUT_S", "0.5"),
        ("PIN_IDENTITY_OUTBOX_RELAY_CREATES_TOPICS", "sometimes"),
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
