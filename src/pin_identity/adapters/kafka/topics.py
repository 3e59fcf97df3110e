"""Our topics (compacted, with the configured partitions and replication), and the broker at start: are the
client properties acceptable, does a broker answer, and what a broker failure says about the configuration."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._config import AlterConfigOpType, ConfigEntry, ConfigResource
from confluent_kafka.cimpl import NewTopic

from pin_identity.adapters.kafka.client_log import silenced, with_client_log
from pin_identity.adapters.kafka.consumers import new_consumer
from pin_identity.adapters.kafka.denials import DenialLog, denial
from pin_identity.adapters.kafka.publisher import WriteLimits, producer_config
from pin_identity.adapters.system_clock import SYSTEM_CLOCK
from pin_identity.observability.logging import first_line, get_logger

# librdkafka writes its log lines raw to stderr unless it is given a logger. The checks below report their
# outcome as one line of their own, so their clients log nowhere.
_quiet = silenced("checks")
log = get_logger("kafka-topics")

_PROBE_STEP_S = 0.5


# With three replicas or more, a write (the relay's are acks=all) is acknowledged once two of them have it:
# one node lost loses nothing acknowledged and stops nothing. With fewer, the broker's own setting holds.
REPLICAS_FOR_MIN_INSYNC = 3
MIN_INSYNC_REPLICAS = 2
# The largest event a topic of ours takes (and so the relay's producer): a user's access snapshot of 20,000
# Active assignments (about 350 bytes each before compression) fits. librdkafka checks an event's size before
# compression, the broker a batch's after it. Consumers fetch a larger record whole whatever their
# fetch.max.bytes (a partition's first record is always returned).
EVENT_MAX_BYTES = 8 * 2**20


@dataclass(frozen=True)
class TopicLayout:
    partitions: int
    replication_factor: int

    @property
    def config(self) -> dict[str, str]:
        """The settings of a topic of ours: compacted (one record per key is what readers need)."""
        config = {"cleanup.policy": "compact", "max.message.bytes": str(EVENT_MAX_BYTES)}
        if self.replication_factor >= REPLICAS_FOR_MIN_INSYNC:
            config["min.insync.replicas"] = str(MIN_INSYNC_REPLICAS)
        return config


def ensure_topics(
    client_config: dict[str, str], names: Iterable[str], layout: TopicLayout, *, timeout_s: float = 15.0
) -> list[str]:
    """Create the missing topics (`layout`'s settings); returns the names created (an existing topic is left
    as it is)."""
    admin = AdminClient(with_client_log(client_config))
    existing = set(admin.list_topics(timeout=timeout_s).topics)
    missing = [name for name in names if name not in existing]
    if not missing:
        return []
    futures = admin.create_topics(
        [
            NewTopic(name, layout.partitions, layout.replication_factor, config=layout.config)
            for name in missing
        ],
        operation_timeout=timeout_s,
        request_timeout=timeout_s,
    )
    created = []
    for name, future in futures.items():
        try:
            future.result()
            created.append(name)
        except KafkaException as exc:
            refused = DenialLog("ensure-topics").say(denial(exc, "Create", name))
            if refused is not None:
                raise KafkaException(KafkaError(exc.args[0].code(), str(refused))) from None
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise
    return created


def raise_message_limits(
    client_config: dict[str, str], names: Iterable[str], *, timeout_s: float = 15.0
) -> list[str]:
    """Topics of ours made before their events could be large (`max.message.bytes` below EVENT_MAX_BYTES)
    are raised to it (`kafka ensure-topics`: its principal may alter topic configs, the relay's may not);
    returns the names raised."""
    admin = AdminClient(with_client_log(client_config))
    limits = _message_limits(admin, names, timeout_s)
    low = [name for name, limit in limits.items() if limit < EVENT_MAX_BYTES]
    if not low:
        return []
    value = str(EVENT_MAX_BYTES)
    raised = [
        ConfigResource(
            ConfigResource.Type.TOPIC,
            name,
            incremental_configs=[
                ConfigEntry("max.message.bytes", value, incremental_operation=AlterConfigOpType.SET)
            ],
        )
        for name in low
    ]
    for resource, future in admin.incremental_alter_configs(raised, request_timeout=timeout_s).items():
        try:
            future.result(timeout=timeout_s)
        except KafkaException as exc:
            refused = DenialLog("ensure-topics").say(denial(exc, "AlterConfigs", resource.name))
            raise KafkaException(KafkaError(exc.args[0].code(), str(refused or exc.args[0].str()))) from None
    return low


def write_limits(
    client_config: dict[str, str], names: Iterable[str], *, timeout_s: float = 5.0
) -> WriteLimits:
    """The relay's producer takes no event larger than every topic takes, so the broker refuses no request
    for an event's size and a larger event fails alone; and it keeps the events of a partition short of
    replicas out of its transactions. Empty when the broker does not say."""
    try:
        configs = _topic_configs(AdminClient(with_client_log(client_config)), names, timeout_s)
        return WriteLimits(
            min((int(config["max.message.bytes"]) for config in configs.values()), default=None),
            {name: int(config["min.insync.replicas"]) for name, config in configs.items()},
        )
    except (KafkaException, TimeoutError, KeyError, ValueError) as exc:
        log.warning("kafka-write-limits-unknown", error=first_line(exc))
        return WriteLimits()


def _message_limits(admin: AdminClient, names: Iterable[str], timeout_s: float) -> dict[str, int]:
    configs = _topic_configs(admin, names, timeout_s)
    return {name: int(config["max.message.bytes"]) for name, config in configs.items()}


def _topic_configs(admin: AdminClient, names: Iterable[str], timeout_s: float) -> dict[str, dict[str, str]]:
    """The configs of those of the topics the broker has (topic -> name -> value)."""
    existing = set(admin.list_topics(timeout=timeout_s).topics)
    resources = [ConfigResource(ConfigResource.Type.TOPIC, name) for name in names if name in existing]
    if not resources:
        return {}
    futures = admin.describe_configs(resources, request_timeout=timeout_s)
    return {
        resource.name: {key: entry.value for key, entry in future.result(timeout=timeout_s).items()}
        for resource, future in futures.items()
    }


def replication_shortfall(
    client_config: dict[str, str], names: Iterable[str], *, timeout_s: float = 2.0
) -> str | None:
    """Which of the topics have partitions with fewer in-sync replicas than their `min.insync.replicas`,
    in one line: the broker refuses every acks=all write to those (NOT_ENOUGH_REPLICAS), and librdkafka
    only retries it until the delivery times out. None when none has, or the broker did not say (it never
    raises: the relay asks while it backs off)."""
    admin = AdminClient(with_client_log(client_config))
    try:
        short = _partitions_out_of_sync(admin, names, timeout_s)
        needed = _min_insync(admin, short, timeout_s) if short else {}
    except KafkaException as exc:
        DenialLog("outbox-relay").say(denial(exc, "DescribeConfigs", names))
        return None
    except (TimeoutError, KeyError, ValueError):
        return None
    lines = [
        _shortfall_line(name, partitions, needed[name])
        for name, partitions in sorted(short.items())
        if any(in_sync < needed[name] for _, in_sync, _ in partitions)
    ]
    return "; ".join(lines) or None


def _partitions_out_of_sync(
    admin: AdminClient, names: Iterable[str], timeout_s: float
) -> dict[str, list[tuple[int, int, int]]]:
    """topic -> (partition, replicas in sync, replicas) of each partition with a replica out of sync."""
    topics = admin.list_topics(timeout=timeout_s).topics
    short = {
        name: sorted(
            (number, len(partition.isrs), len(partition.replicas))
            for number, partition in topics[name].partitions.items()
            if len(partition.isrs) < len(partition.replicas)
        )
        for name in names
        if name in topics
    }
    return {name: partitions for name, partitions in short.items() if partitions}


def _min_insync(admin: AdminClient, names: Iterable[str], timeout_s: float) -> dict[str, int]:
    resources = [ConfigResource(ConfigResource.Type.TOPIC, name) for name in names]
    futures = admin.describe_configs(resources, request_timeout=timeout_s)
    return {
        resource.name: int(future.result(timeout=timeout_s)["min.insync.replicas"].value)
        for resource, future in futures.items()
    }


def _shortfall_line(topic: str, partitions: Sequence[tuple[int, int, int]], needed: int) -> str:
    numbers = ", ".join(str(number) for number, in_sync, _ in partitions if in_sync < needed)
    fewest = min(in_sync for _, in_sync, _ in partitions)
    replicas = max(total for _, _, total in partitions)
    return (
        f"{topic} has {fewest} of {replicas} replicas in sync (partitions {numbers}) and needs {needed} "
        "for a write (NOT_ENOUGH_REPLICAS)"
    )


def broker_reachable(client_config: dict[str, str], timeout_s: float = 3.0) -> bool:
    try:
        probe_broker(client_config, timeout_s=timeout_s)
        return True
    except BrokerProbeError:  # or refused
        return False


# ---------------------------------------------------------------- the broker at start


class KafkaPropertiesError(ValueError):
    """librdkafka refuses the extra properties: an unknown one, an invalid value, or a combination."""


class BrokerFailure(StrEnum):
    """What a broker failure says about the configuration."""

    UNREACHABLE = "unreachable"
    REFUSED = "refused"
    REPLICATION = "replication"
    PARTITIONS = "partitions"


class BrokerProbeError(Exception):
    """No broker answered; `failure` is what that says about the configuration."""

    failure = BrokerFailure.UNREACHABLE


class BrokerRefusedError(BrokerProbeError):
    """A broker answered and refused the client (authentication, TLS, authorization)."""

    failure = BrokerFailure.REFUSED


def check_client_properties(properties: Mapping[str, str]) -> None:
    """Build the relay's producer and a consumer from the properties, connecting nowhere: librdkafka itself
    says what it would refuse later, in a job thread, as a traceback."""
    if not properties:
        return
    try:
        # As the relay builds it: transactional (so `enable.idempotence=false` is refused here, not there).
        transactional = {"transactional.id": "pin-identity-config-check", **producer_config(dict(properties))}
        Producer({**transactional, "logger": _quiet})
        new_consumer(properties, {"group.id": "pin-identity-config-check", "logger": _quiet}).close()
    except (KafkaException, TypeError, ValueError) as exc:  # the last two for the Python-side keys
        raise KafkaPropertiesError(failure_reason(exc)) from None


def probe_broker(client_config: Mapping[str, str], *, timeout_s: float = 5.0) -> None:
    """Return once a broker answers a metadata request; raise as soon as librdkafka knows none will (every
    broker down, a refused login), else when `timeout_s` has passed."""
    heard: list[KafkaError] = []
    config: dict[str, Any] = {**client_config, "logger": _quiet, "error_cb": heard.append}
    admin, deadline = AdminClient(config), SYSTEM_CLOCK.monotonic() + timeout_s
    while True:
        try:
            admin.list_topics(timeout=min(_PROBE_STEP_S, max(deadline - SYSTEM_CLOCK.monotonic(), 0.1)))
            return
        except KafkaException as exc:
            last = failure_reason(exc)
        admin.poll(0)  # serves error_cb: the reason, as early as librdkafka has it
        if any(error.code() in _HOPELESS for error in heard):
            raise _failure(heard)
        if SYSTEM_CLOCK.monotonic() >= deadline:
            silent = BrokerProbeError(f"no answer in {timeout_s:g} s: {last}")
            raise _failure(heard) if heard else silent


# A refused login is final whichever broker said it; every broker down is final at start. One broker that
# does not resolve or fails its TLS handshake is not: another one of the list may answer.
_HOPELESS = {KafkaError._ALL_BROKERS_DOWN, KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED}
_REFUSED = {
    KafkaError._AUTHENTICATION,
    KafkaError.SASL_AUTHENTICATION_FAILED,
    KafkaError._SSL,
    KafkaError.TOPIC_AUTHORIZATION_FAILED,
    KafkaError.CLUSTER_AUTHORIZATION_FAILED,
    KafkaError.GROUP_AUTHORIZATION_FAILED,
}


def _failure(heard: Sequence[KafkaError]) -> Exception:
    refused = [error for error in heard if error.code() in _REFUSED]
    if refused:
        return BrokerRefusedError(refused[0].str())
    return BrokerProbeError(_first_cause(heard))


def _first_cause(heard: Sequence[KafkaError]) -> str:
    """The first specific error (`Connect to ... failed: Connection refused`), not `1/1 brokers are down`."""
    specific = [error for error in heard if error.code() != KafkaError._ALL_BROKERS_DOWN]
    return (specific or list(heard))[0].str() if heard else ""


def failure_reason(exc: BaseException) -> str:
    """A broker failure in one line: librdkafka's own words for its KafkaError, else the exception's."""
    error = exc.args[0] if exc.args else None
    return first_line(exc, error.str() if isinstance(error, KafkaError) else None)


_FAILURES = {
    **dict.fromkeys(
        (KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN, KafkaError._RESOLVE, KafkaError._TIMED_OUT),
        BrokerFailure.UNREACHABLE,
    ),
    **dict.fromkeys(_REFUSED, BrokerFailure.REFUSED),
    KafkaError.INVALID_REPLICATION_FACTOR: BrokerFailure.REPLICATION,
    KafkaError.INVALID_PARTITIONS: BrokerFailure.PARTITIONS,
}


def broker_failure(exc: BaseException) -> tuple[BrokerFailure, str] | None:
    """The kind and reason of a KafkaException that points at the configuration; None for any other."""
    error = exc.args[0] if isinstance(exc, KafkaException) and exc.args else None
    if not isinstance(error, KafkaError) or error.code() not in _FAILURES:
        return None
    return _FAILURES[error.code()], failure_reason(exc)
