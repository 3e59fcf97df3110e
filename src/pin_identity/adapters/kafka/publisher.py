"""Publishing outbox rows with an idempotent producer (acks=all), one report per batch."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from pin_identity.domain.events import CONTRACT_VERSION
from pin_identity.jobs.ports import PendingEvent, PublishReport
from pin_identity.observability import metrics
from pin_identity.observability.logging import get_logger

log = get_logger("kafka-publisher")

# Errors that no retry can fix: the row goes to the dead letters instead of blocking the rows behind it.
_PERMANENT = {
    KafkaError.MSG_SIZE_TOO_LARGE,
    KafkaError.RECORD_LIST_TOO_LARGE,
    KafkaError.INVALID_RECORD,
    KafkaError.TOPIC_EXCEPTION,
    KafkaError.POLICY_VIOLATION,
    KafkaError._INVALID_ARG,
}
_UNKNOWN_TOPIC = {"UNKNOWN_TOPIC_OR_PART", "_UNKNOWN_TOPIC"}
STOP_GRACE_S = 10.0


def producer_config(client_config: dict[str, str]) -> dict[str, Any]:
    defaults: dict[str, Any] = {
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 5,
        "queue.buffering.max.messages": 200_000,
        "message.timeout.ms": 60_000,
    }
    return {**defaults, **client_config}


class KafkaEventPublisher:
    """Keeps one producer, and replaces it after a fatal error or a batch of which nothing was acknowledged.

    A producer whose broker lost its idempotence state (a cluster rebuilt from scratch) never delivers
    again; a fresh producer gets a new producer id. Batches are sent one after another, so the swap cannot
    reorder events.
    """

    def __init__(self, client_config: dict[str, str], ensure_topics: Callable[[], object]):
        self._config = producer_config(client_config)
        self._ensure_topics = ensure_topics
        self._producer: Producer | None = None
        self._replace = False
        self._unknown_topic_retried: set[str] = set()

    def _on_error(self, error: KafkaError) -> None:
        if error.fatal():
            self._replace = True
        log.warning("kafka-client-error", code=error.name(), fatal=error.fatal())

    def _current(self) -> Producer:
        if self._producer is not None and self._replace:
            log.warning("kafka-producer-replaced")
            self._producer.purge()
            self._producer.flush(0)
            self._producer = None
        if self._producer is None:
            self._producer = Producer({**self._config, "error_cb": self._on_error})
            self._replace = False
        return self._producer

    def publish(self, events: Sequence[PendingEvent], should_stop: Callable[[], bool]) -> PublishReport:
        producer = self._current()
        report = PublishReport()
        outstanding: set[int] = set()
        for event in events:
            self._produce(producer, event, report, outstanding)
        self._await_acks(producer, outstanding, should_stop)
        for outbox_id in outstanding:
            report.retry[outbox_id] = "_NOT_ACKNOWLEDGED"
        if report.retry and not report.delivered:
            self._replace = True
        self._recheck_unknown_topics(report, events)
        return report

    def _produce(
        self, producer: Producer, event: PendingEvent, report: PublishReport, outstanding: set[int]
    ) -> None:
        message, outbox_id = event.message, event.outbox_id

        def on_delivery(error: KafkaError | None, _msg: Message, outbox_id: int = outbox_id) -> None:
            outstanding.discard(outbox_id)
            self._classify(outbox_id, message.topic, error, report)

        headers: list[tuple[str, str | bytes | None]] = [
            ("event-type", message.event_type.encode()),
            ("contract-version", str(CONTRACT_VERSION).encode()),
            ("correlation-id", str(message.correlation_id).encode()),
        ]
        if message.traceparent:
            headers.append(("traceparent", message.traceparent.encode()))
        while True:
            try:
                producer.produce(
                    message.topic,
                    key=message.key,
                    value=message.value.encode(),
                    headers=headers,
                    on_delivery=on_delivery,
                )
                outstanding.add(outbox_id)
                return
            except BufferError:
                producer.poll(0.1)  # the local queue is full: let deliveries drain it
            except KafkaException as exc:
                self._classify(outbox_id, message.topic, exc.args[0], report)
                return

    def _classify(self, outbox_id: int, topic: str, error: KafkaError | None, report: PublishReport) -> None:
        if error is None:
            report.delivered.append(outbox_id)
            metrics.outbox_published_total.labels(topic=topic).inc()
        elif error.code() in _PERMANENT:
            report.rejected[outbox_id] = f"{error.name()}: {error.str()}"
        else:
            report.retry[outbox_id] = error.name()

    def _await_acks(self, producer: Producer, outstanding: set[int], should_stop: Callable[[], bool]) -> None:
        stop_deadline: float | None = None
        while outstanding:
            producer.flush(0.2)
            if should_stop():
                stop_deadline = stop_deadline or time.monotonic() + STOP_GRACE_S
                if time.monotonic() > stop_deadline:
                    return  # rows stay in the outbox and go again after the restart (at-least-once)

    def _recheck_unknown_topics(self, report: PublishReport, events: Sequence[PendingEvent]) -> None:
        """An unknown topic is retried once after ensuring topics; unknown again, the row is dead-lettered."""
        unknown = [oid for oid, code in report.retry.items() if code in _UNKNOWN_TOPIC]
        if not unknown:
            return
        topic_of = {event.outbox_id: event.message.topic for event in events}
        for outbox_id in unknown:
            if topic_of[outbox_id] in self._unknown_topic_retried:
                code = report.retry.pop(outbox_id)
                report.rejected[outbox_id] = (
                    f"{code}: topic {topic_of[outbox_id]} unknown after ensure-topics"
                )
        self._unknown_topic_retried |= {topic_of[outbox_id] for outbox_id in unknown}
        self._ensure_topics()

    def close(self) -> None:
        if self._producer is not None:
            self._producer.flush(5)
