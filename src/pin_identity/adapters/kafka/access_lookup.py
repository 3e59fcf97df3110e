"""One user's last event on the access topic (`access show`), without reading the topic whole.

The user's key goes to one partition, computed as the relay's producer computes it (partitioning.py). That
partition is read backwards in windows: the newest `first_window` records up to its end, then the window
before it, twice as large each time, until a window holds the key (its last record there is the user's last
event) or the partition's beginning is reached. A user whose last change is recent costs one small read; one
whose only event is the partition's oldest record costs about two reads of the partition.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any
from uuid import UUID

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from pin_identity.adapters.kafka.client_log import silenced
from pin_identity.adapters.kafka.consumers import new_consumer
from pin_identity.adapters.kafka.denials import DenialLog, denial
from pin_identity.adapters.kafka.offsets import end_reached, watermarks
from pin_identity.adapters.kafka.partitioning import key_partition, partitioner_of
from pin_identity.adapters.system_clock import SYSTEM_CLOCK
from pin_identity.domain.errors import BrokerUnavailableError
from pin_identity.domain.events import ACCESS_TOPIC
from pin_identity.operations.ports.access_reads import AccessEventOnTopic, AccessLogSearch

# librdkafka's own lines (a broker that does not answer) stay out of a command's one-line answer: a failure is
# raised as BrokerUnavailableError with its reason.
_librdkafka_log = silenced("access_lookup")

FIRST_WINDOW = 1_000
MAX_WINDOW = 64_000
_BATCH = 10_000
# consume() waits its whole timeout unless a full batch arrives: a short one hands over what has arrived.
_POLL_S = 0.02


class KafkaUserAccessLog:
    def __init__(
        self,
        client_config: dict[str, str],
        *,
        topic: str = ACCESS_TOPIC,
        first_window: int = FIRST_WINDOW,
        timeout_s: float = 5.0,
    ):
        self._partitioner = partitioner_of(client_config)  # UnsupportedPartitionerError: nothing to compute
        self._client_config = client_config
        self._settings: dict[str, Any] = {
            "group.id": "pin-identity-access-show",  # never joined: the partition is assigned
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
            # Prefetch about one window past the one being read, not librdkafka's 100,000 records; and with
            # a full prefetch queue, fetch again soon rather than after librdkafka's second.
            "queued.min.messages": first_window,
            "fetch.queue.backoff.ms": 10,
            # The end of the partition is known when a fetch there comes back empty; the broker holds such a
            # fetch this long (librdkafka's default, 500 ms, put a wait of its own on every answer).
            "fetch.wait.max.ms": 10,
            "logger": _librdkafka_log,
        }
        self._topic, self._first_window, self._timeout_s = topic, first_window, timeout_s
        self._denials = DenialLog("access-show")

    def last_event(self, user_id: UUID) -> AccessLogSearch:
        key = str(user_id).encode()
        try:
            consumer = new_consumer(self._client_config, self._settings)
        except KafkaException as exc:
            raise BrokerUnavailableError(self._reason(exc)) from None
        try:
            partitions = self._partition_count(consumer)
            if partitions is None:  # no topic, no event
                return AccessLogSearch(partition=None, records_read=0, last_event=None)
            partition = key_partition(key, partitions, self._partitioner)
            found, read = self._search(consumer, partition, key)
            return AccessLogSearch(partition, read, _last_event(found) if found is not None else None)
        except KafkaException as exc:
            raise BrokerUnavailableError(self._reason(exc)) from None
        finally:
            consumer.close()

    def _reason(self, exc: KafkaException) -> str:
        """The lookup reads one partition of the topic and names a group it never joins, whose coordinator
        librdkafka looks for all the same."""
        group_refused = exc.args[0].code() == KafkaError.GROUP_AUTHORIZATION_FAILED
        if group_refused:
            refused = denial(exc, "Describe", str(self._settings["group.id"]))
        else:
            refused = denial(exc, "Read", self._topic)
        return str(self._denials.say(refused) or exc)

    def _partition_count(self, consumer: Consumer) -> int | None:
        metadata = consumer.list_topics(self._topic, timeout=self._timeout_s)
        topic = metadata.topics.get(self._topic)
        # A topic this principal may not read is no topic without events: the user would show as missing.
        if topic is not None and topic.error is not None and denial(topic.error, "Read", self._topic):
            raise KafkaException(topic.error)
        if topic is None or topic.error is not None or not topic.partitions:
            return None
        return len(topic.partitions)

    def _search(self, consumer: Consumer, partition: int, key: bytes) -> tuple[Message | None, int]:
        # The end as the lookup begins: an event published after it is the next lookup's business.
        low, end = watermarks(consumer, TopicPartition(self._topic, partition), self._timeout_s)
        window, read = self._first_window, 0
        while end > low:
            start = max(low, end - window)
            found, count = self._read_window(consumer, partition, key, start, end)
            read += count
            if found is not None:
                return found, read
            end, window = start, min(window * 2, MAX_WINDOW)
        return None, read

    def _read_window(
        self, consumer: Consumer, partition: int, key: bytes, start: int, stop: int
    ) -> tuple[Message | None, int]:
        """The last record of `key` among offsets [start, stop), and the number of records read. Compaction
        (and a transaction's markers) leave gaps: the window ends at the first offset >= stop, or where an end
        of partition signal at or past `stop` says the partition ends (offsets.py)."""
        consumer.assign([TopicPartition(self._topic, partition, start)])
        found, count, heard = None, 0, SYSTEM_CLOCK.monotonic()
        while True:
            messages = consumer.consume(_BATCH, _POLL_S)
            if not messages and SYSTEM_CLOCK.monotonic() - heard > self._timeout_s:
                raise BrokerUnavailableError(
                    f"{self._topic} [{partition}]: nothing read from offset {start} in {self._timeout_s:g} s"
                )
            if messages:
                heard = SYSTEM_CLOCK.monotonic()
            for message in messages:
                error = message.error()
                if error is not None and error.code() != KafkaError._PARTITION_EOF:
                    raise KafkaException(error)
                if error is None and (message.offset() or 0) < stop:
                    count += 1
                    if message.key() == key:
                        found = message
                if end_reached(message, stop):
                    return found, count


def _last_event(message: Message) -> AccessEventOnTopic | None:
    """None for a tombstone: compaction forgets the user's events (the audit reads it the same way)."""
    value = message.value()
    if value is None:
        return None
    body = _json_object(value)
    payload = body.get("payload")
    payload = payload if isinstance(payload, dict) else {}
    return AccessEventOnTopic(
        partition=message.partition() or 0,
        offset=message.offset() or 0,
        event_id=_text(body.get("eventId")),
        version=payload.get("version") if isinstance(payload.get("version"), int) else None,
        change_reason=_text(payload.get("changeReason")),
        changed_role_id=_text(payload.get("changedRoleId")),
        occurred_at=_moment(body.get("occurredAt")),
        active_assignments=payload.get("activeAssignments"),
    )


def _json_object(value: bytes | str) -> dict[str, Any]:
    try:
        body = json.loads(value)
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _moment(value: object) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        return None
