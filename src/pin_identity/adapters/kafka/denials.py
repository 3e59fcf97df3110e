"""A request the broker's authorizer refused, said the way an operator fixes it: which operation on which
resource this job's principal lacks, a row of the ACL table (acls.py). One stable log event,
`kafka-access-denied`, wherever a job meets it; the job itself holds or retries as it does for any broker
failure, so that nothing is lost and it goes on once the ACL is granted."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaError, KafkaException

from pin_identity.adapters.system_clock import SYSTEM_CLOCK
from pin_identity.domain.clock import Clock
from pin_identity.observability.logging import get_logger

log = get_logger("kafka")

_RESOURCES = {
    KafkaError.TOPIC_AUTHORIZATION_FAILED: "topic",
    KafkaError.GROUP_AUTHORIZATION_FAILED: "group",
    KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED: "transactional-id",
    KafkaError.CLUSTER_AUTHORIZATION_FAILED: "cluster",
}
_SAID = "Kafka denied"
_GROUP_ERROR_WAIT_S = 0.5
# The same denial is said again at most this often while it lasts (a relay retries every 10 s at most).
_SAY_EVERY_S = 60.0


@dataclass(frozen=True)
class Denial:
    operation: str  # as kafka-acls spells it: Write, Read, Describe, DescribeConfigs, Create
    resource: str  # topic | group | transactional-id | cluster
    name: str
    code: str

    def __str__(self) -> str:
        return (
            f"{_SAID} {self.operation} on {self.resource} {self.name} ({self.code}): grant it to this "
            "job's principal (`pin-identity kafka acls`)"
        )


def is_denial(reason: str) -> bool:
    """Whether a failure's one line is a denial's (it names what to grant, not an outage)."""
    return reason.startswith(_SAID)


def kafka_error(failure: BaseException | KafkaError | None) -> KafkaError | None:
    if isinstance(failure, KafkaError):
        return failure
    if isinstance(failure, KafkaException) and failure.args and isinstance(failure.args[0], KafkaError):
        return failure.args[0]
    return None


def denial(
    failure: BaseException | KafkaError | None, operation: str, names: str | Iterable[str]
) -> Denial | None:
    """The denial `failure` is, if the authorizer refused it; `names` are the resources of the kind the
    error names that the request touched: the one named in the broker's message when there are several."""
    error = kafka_error(failure)
    if error is None or error.code() not in _RESOURCES:
        return None
    candidates = [names] if isinstance(names, str) else list(names)
    named = [name for name in candidates if name in error.str()]
    return Denial(operation, _RESOURCES[error.code()], ", ".join(named or candidates), error.name())


def group_denial(consumer: Consumer, operation: str, group: str) -> Denial | None:
    """Why a request of a group timed out or waited for a coordinator, when the authorizer refused to name
    that coordinator: librdkafka hands the refusal to the consumer's next poll, not to the request."""
    event = consumer.poll(_GROUP_ERROR_WAIT_S)
    return denial(event.error() if event is not None else None, operation, group)


class DenialLog:
    """Says each denial once, then again only while it lasts past `_SAY_EVERY_S`."""

    def __init__(self, component: str, clock: Clock = SYSTEM_CLOCK):
        self._component, self._clock = component, clock
        self._said_at: dict[Denial, float] = {}

    def say(self, refused: Denial | None) -> Denial | None:
        if refused is None:
            return None
        now = self._clock.monotonic()
        if now - self._said_at.get(refused, -_SAY_EVERY_S) >= _SAY_EVERY_S:
            self._said_at[refused] = now
            log.warning(
                "kafka-access-denied",
                job=self._component,
                operation=refused.operation,
                resource=refused.resource,
                name=refused.name,
                code=refused.code,
                message=str(refused),
            )
        return refused
