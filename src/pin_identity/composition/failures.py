"""The failures that name a variable: what the database or the broker said, as the one line an operator reads
(the CLI exits 2 with it, the HTTP API answers it), naming the setting to check."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg

from pin_identity.adapters.kafka.topics import BrokerFailure, broker_failure
from pin_identity.config import ConfigurationError, Settings
from pin_identity.observability.logging import first_line

DATABASE_UNREACHABLE = "PIN_IDENTITY_DATABASE_URL: database unreachable ({})"
DATABASE_APPLY = "PIN_IDENTITY_DATABASE_URL: {}; {}"
DATABASE_REFUSED = "PIN_IDENTITY_DATABASE_URL: {} (`pin-identity db grants` says what each job needs)"
BROKER_FAILURES = {
    BrokerFailure.UNREACHABLE: "PIN_IDENTITY_KAFKA_BOOTSTRAP_SERVERS: broker unreachable ({})",
    BrokerFailure.REFUSED: "PIN_IDENTITY_KAFKA_CONFIG: the broker refused the client ({})",
    BrokerFailure.REPLICATION: "PIN_IDENTITY_KAFKA_REPLICATION_FACTOR: the broker refused it ({})",
    BrokerFailure.PARTITIONS: "PIN_IDENTITY_KAFKA_TOPIC_PARTITIONS: the broker refused it ({})",
}
# libpq's own failures carry no SQLSTATE; 08 is the connection class, 57P the server going away.
_CONNECTION_SQLSTATES = ("08", "57P")


def broker_failure_line(settings: Settings, failure: BrokerFailure, reason: object) -> str:
    """The table's line; a refused login names the file it came from when the login is one."""
    line = BROKER_FAILURES[failure].format(reason)
    if failure is BrokerFailure.REFUSED and settings.kafka_config_file:
        return line.replace("PIN_IDENTITY_KAFKA_CONFIG:", "PIN_IDENTITY_KAFKA_CONFIG_FILE:", 1)
    return line


def missing_extra(variable: str) -> ConfigurationError:
    return ConfigurationError(
        f"{variable} is not configured and the embedded server is not installed "
        "(pip install 'pin-identity[embedded]')"
    )


def dependency_error(exc: BaseException) -> ConfigurationError | None:
    """An unexpected failure of the database or the broker as one line naming the variable to check, or
    None for anything else: a statement timeout, a constraint or a bug must not pass for a configuration
    problem."""
    for cause in _causes(exc):
        failure = broker_failure(cause)
        if failure is not None:
            kind, reason = failure
            return ConfigurationError(BROKER_FAILURES[kind].format(reason))
        if isinstance(cause, psycopg.errors.InsufficientPrivilege):
            return ConfigurationError(DATABASE_REFUSED.format(first_line(cause)))
        if isinstance(cause, psycopg.OperationalError) and (
            cause.sqlstate is None or cause.sqlstate.startswith(_CONNECTION_SQLSTATES)
        ):
            return ConfigurationError(DATABASE_UNREACHABLE.format(first_line(cause)))
    return None


def _causes(exc: BaseException) -> Iterator[BaseException]:
    """The exception and what it explicitly wraps (SQLAlchemy raises its error `from` the driver's). Not
    `__context__`: a bug while handling a lost connection is still a bug."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__
