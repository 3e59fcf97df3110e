"""The embedded PostgreSQL and Apache Kafka (no URL or bootstrap servers configured): found again or started
under the data dir, described, fetched and stopped (`embedded info/fetch/stop`)."""

from __future__ import annotations

from pathlib import Path

from pin_identity.adapters.embedded_state import (
    EmbeddedServer,
    embedded_broker_state,
    embedded_postgres_state,
)
from pin_identity.adapters.kafka import embedded_kafka
from pin_identity.adapters.kafka.distribution import KafkaRuntime, KafkaRuntimeUnavailableError, kafka_runtime
from pin_identity.adapters.postgres import embedded_postgres
from pin_identity.composition.failures import missing_extra
from pin_identity.config import ConfigurationError, Settings

EMBEDDED_DATABASE_NAME = embedded_postgres.DATABASE_NAME


def database_url(settings: Settings) -> str:
    """The configured URL, else the embedded server's (started when it is not running)."""
    if settings.database_url:
        return settings.database_url
    try:
        return embedded_postgres.ensure_embedded_postgres(settings.data_dir)
    except ImportError:
        raise missing_extra("PIN_IDENTITY_DATABASE_URL") from None
    except embedded_postgres.EmbeddedPostgresUnavailableError as exc:
        raise ConfigurationError(
            f"PIN_IDENTITY_DATABASE_URL: unset, and the embedded PostgreSQL cannot run here ({exc}); "
            "set it to a PostgreSQL's URL"
        ) from None


def bootstrap_servers(settings: Settings) -> str:
    """The configured bootstrap servers, else the embedded broker's (started when it is not running)."""
    if settings.kafka_bootstrap_servers:
        return settings.kafka_bootstrap_servers
    try:
        return embedded_kafka.ensure_embedded_kafka(settings.data_dir)
    except KafkaRuntimeUnavailableError as exc:
        raise _no_embedded_kafka(exc) from None


def embedded_servers(settings: Settings) -> tuple[EmbeddedServer, EmbeddedServer]:
    """The embedded PostgreSQL and broker under the data dir, as they are: nothing is started."""
    data_dir = settings.data_dir.resolve()
    return (
        embedded_postgres_state(data_dir, in_use=not settings.database_url),
        embedded_broker_state(data_dir, in_use=not settings.kafka_bootstrap_servers),
    )


def fetch_embedded_kafka(settings: Settings) -> KafkaRuntime | None:
    """Fetch the embedded broker's release into the cache and prepare its starts (`embedded fetch`); None
    when a broker of one's own is configured and nothing needs fetching."""
    if settings.kafka_bootstrap_servers:
        return None
    try:
        runtime = kafka_runtime()
    except KafkaRuntimeUnavailableError as exc:
        raise _no_embedded_kafka(exc) from None
    embedded_kafka.prepare_starts(runtime)
    return runtime


def local_port(preferred: int) -> int:
    """`preferred` unless something on this host answers there, else a port free now."""
    return embedded_kafka.free_port() if embedded_kafka.port_open(preferred) else preferred


def stop_embedded_servers(data_dir: Path) -> tuple[bool, bool]:
    """Stop the embedded broker, then PostgreSQL; whether each was running."""
    return embedded_kafka.stop_embedded_kafka(data_dir), embedded_postgres.stop_embedded_postgres(data_dir)


def _no_embedded_kafka(exc: KafkaRuntimeUnavailableError) -> ConfigurationError:
    return ConfigurationError(
        f"PIN_IDENTITY_KAFKA_BOOTSTRAP_SERVERS: unset, and the embedded Apache Kafka cannot run here "
        f"({exc}); set it to a Kafka cluster's bootstrap servers"
    )
