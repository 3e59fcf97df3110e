"""What the outbox relay tells operators: its log lines (stable `event` names) and its metrics, in one place.

The relay calls one hook per thing that happened; tests subclass the observer to wait on those hooks as
signals instead of polling or sleeping.
"""

from __future__ import annotations

from collections.abc import Mapping

from pin_identity.observability import metrics
from pin_identity.observability.logging import describe_error, get_logger
from pin_identity.operations.ports.outbox import OutboxBacklog, PublishingHolder

log = get_logger("outbox-relay")


def _who(holder: PublishingHolder) -> tuple[int | None, str | None]:
    return holder.pid, holder.prepared_gid


# A transaction that took an outbox id and runs this long is named in the log (a hung request of a writer).
HELD_AFTER_S = 10.0
# The broker acknowledges a healthy relay's transactions within a second: this long without an acknowledgement
# while events wait is an outage (a lost coordinator or leader, a broker down), said before the alerts on age.
SILENT_AFTER_S = 5.0


class RelayObserver:
    def __init__(self, *, held_after_s: float = HELD_AFTER_S, silent_after_s: float = SILENT_AFTER_S) -> None:
        self._held_after_s = held_after_s
        self._silent_after_s = silent_after_s
        self._silent_for_s: float | None = None  # while the broker has been silent past silent_after_s
        self._held_by_reported: PublishingHolder | None = None  # the session last named as holding publishing
        # Topics the broker does not have, whose events are held (topic -> why the relay did not recreate
        # it). Replaced, never changed in place: `/readyz` reads it from another thread.
        self._missing_topics: dict[str, str] = {}
        self._replicas_short: str | None = None  # what the broker said of too few replicas in sync
        self._held_by_prepared: str | None = None  # a prepared transaction holding publishing, in words
        self._id_shared: str | None = None  # the transactional.id used outside the outbox, in words

    def started(self) -> None:
        log.info("outbox-relay-started")

    def stopped(self) -> None:
        log.info("outbox-relay-stopped")

    def took_over(self) -> None:
        """The lock came from a relay that did not stand down cleanly (a crash, a killed session)."""
        log.warning("outbox-relay-took-over")

    def backlog(self, backlog: OutboxBacklog) -> None:
        """Every few seconds. A writer whose transaction runs past `held_after_s` holds every event behind its
        outbox id, revocations included: said once per such writer, and once more when publishing goes on."""
        metrics.record_outbox_backlog(backlog.waiting, backlog.oldest_age_s, backlog.held_s)
        holder = backlog.held_by if backlog.held_s >= self._held_after_s else None
        reported = self._held_by_reported
        if holder is not None and (reported is None or _who(holder) != _who(reported)):
            log.warning(
                "outbox-publishing-held",
                pid=holder.pid,
                application_name=holder.application_name,
                prepared_gid=holder.prepared_gid,
                transaction_s=round(backlog.held_s, 1),
                waiting=backlog.waiting,
                runbook="docs/runbooks.md#outbox-publishing-held",
            )
        elif holder is None and reported is not None:
            log.info("outbox-publishing-resumed", pid=reported.pid, prepared_gid=reported.prepared_gid)
        self._held_by_reported = holder
        # A prepared transaction holds publishing until someone commits or rolls it back, which no timeout
        # does: said on /readyz while it lasts. A live writer is for the log and the alert.
        self._held_by_prepared = (
            f"the outbox relay waits on prepared transaction {holder.prepared_gid!r} (prepared "
            f"{backlog.held_s:.0f} s ago), which took an outbox id: COMMIT PREPARED or ROLLBACK PREPARED it"
            if holder is not None and holder.prepared_gid is not None
            else None
        )

    def ids_went_back(self, read_up_to: int, now_at: int) -> None:
        """The outbox id sequence restarted below what was read: the relay reads from the first row again."""
        metrics.outbox_id_resets_total.inc()
        log.error(
            "outbox-ids-went-back",
            read_up_to=read_up_to,
            sequence_at=now_at,
            runbook="docs/runbooks.md#outbox-ids-went-back",
        )

    def topic_missing(self, topic: str, reason: str) -> None:
        """The broker does not have a topic the relay publishes to, and the relay did not recreate it
        (`reason`): its events are held, tried again and never dead-lettered, until the topic exists."""
        self._missing_topics = {**self._missing_topics, topic: reason}
        metrics.outbox_topic_missing.labels(topic=topic).set(1)
        log.error(
            "outbox-topic-missing",
            topic=topic,
            reason=reason,
            runbook="docs/runbooks.md#outbox-topic-missing",
        )

    def topic_recreated(self, topic: str) -> None:
        """The relay found a topic of its own missing and created it again: its events go out there, and
        whatever the old topic held is gone with it."""
        self._release(topic)
        log.warning("outbox-topic-recreated", topic=topic, runbook="docs/runbooks.md#outbox-topic-missing")

    def topic_found(self, topic: str) -> None:
        """A topic whose events were held exists again (an operator created it): they go out."""
        self._release(topic)
        log.info("outbox-topic-found", topic=topic)

    def _release(self, topic: str) -> None:
        self._missing_topics = {held: why for held, why in self._missing_topics.items() if held != topic}
        metrics.outbox_topic_missing.labels(topic=topic).set(0)

    def missing_topics(self) -> str | None:
        """What `/readyz` warns of while the relay holds the events of a missing topic; None otherwise."""
        held = self._missing_topics
        return (
            "; ".join(
                f"the outbox relay holds the events of {topic}: the broker does not have the topic ({why})"
                for topic, why in sorted(held.items())
            )
            or None
        )

    def replicas_short(self, shortfall: str | None) -> None:
        """Publishing keeps failing, and `shortfall` is what the broker says of too few replicas in sync
        (None: nothing of the kind). The events wait in the outbox, none dead-lettered; said once per new
        shortfall, and on `/readyz` while it lasts."""
        if shortfall == self._replicas_short:
            return
        self._replicas_short = shortfall
        if shortfall is not None:
            log.error(
                "outbox-replicas-short",
                shortfall=shortfall,
                runbook="docs/runbooks.md#outbox-replicas-short",
            )

    def transactional_id_shared(self, fences: int, window_s: float) -> None:
        """The relay's producer was fenced `fences` times within `window_s` while the relay held the lock: a
        producer outside this outbox uses its transactional.id (set in PIN_IDENTITY_KAFKA_CONFIG and shared
        with another outbox's relay). Said once, and on `/readyz` until a window passes without a fence."""
        first = self._id_shared is None
        self._id_shared = (
            f"the outbox relay was fenced {fences} times in {window_s:.0f} s while it held the lock: a "
            "producer outside this outbox uses its transactional.id (PIN_IDENTITY_KAFKA_CONFIG)"
        )
        if first:
            log.error(
                "outbox-transactional-id-shared",
                fences=fences,
                runbook="docs/runbooks.md#outbox-transactional-id-shared",
            )

    def transactional_id_alone(self) -> None:
        if self._id_shared is not None:
            self._id_shared = None
            log.info("outbox-transactional-id-alone")

    def publishing_resumed(self) -> None:
        """The broker took events again after failures in a row."""
        if self._replicas_short is not None:
            self._replicas_short = None
            log.info("outbox-replicas-in-sync")

    def unacknowledged(self, waited_s: float) -> None:
        """Every heartbeat: how long the relay has waited for the broker to acknowledge its events (0 while
        none wait). Past `silent_after_s`: said once, on `/readyz` while it lasts, and once more when the
        broker acknowledges again."""
        metrics.outbox_unacknowledged_seconds.set(waited_s)
        silent_for = self._silent_for_s
        if waited_s >= self._silent_after_s:
            if silent_for is None:
                log.warning(
                    "outbox-broker-silent",
                    waited_s=round(waited_s, 1),
                    runbook="docs/runbooks.md#outbox-broker-silent",
                )
            self._silent_for_s = waited_s
        elif silent_for is not None:
            self._silent_for_s = None
            log.info("outbox-broker-acknowledges", silent_s=round(silent_for, 1))

    def readiness_warning(self) -> str | None:
        """What `/readyz` warns of: the topics whose events are held, a prepared transaction holding
        publishing, a transactional.id shared with another outbox, too few replicas in sync, a broker that
        has acknowledged nothing for a while; or None."""
        short, silent_for = self._replicas_short, self._silent_for_s
        warnings = [
            self.missing_topics(),
            self._held_by_prepared,
            self._id_shared,
            f"the outbox relay cannot publish: {short}" if short else None,
            f"the outbox relay has waited {silent_for:.0f} s for the broker to acknowledge its events"
            if silent_for is not None
            else None,
        ]
        return "; ".join(warning for warning in warnings if warning) or None

    def dead_lettered(self, rejected: Mapping[int, str]) -> None:
        """The broker refused these events for good (outbox id -> error): they left the outbox."""
        metrics.outbox_dead_letters_total.inc(len(rejected))
        for outbox_id, error in rejected.items():
            log.error("outbox-event-dead-lettered", outbox_id=outbox_id, error=error)

    def delivery_failed(self, retry: Mapping[int, str]) -> None:
        """The broker did not take these events (outbox id -> reason: an error, a timeout). Once nothing else
        is in flight the relay backs off (`retrying`) and sends them again, each first of its key."""

    def partition_failing(self, place: tuple[str, int], reason: str, retry_in_s: float) -> None:
        """A partition's events failed (or the broker says it cannot take a write): its events wait, the
        others go on; looked at again after `retry_in_s`."""
        topic, partition = place
        metrics.outbox_publish_errors_total.labels(reason=reason[:60]).inc()
        log.warning(
            "outbox-partition-failing",
            topic=topic,
            partition=partition,
            reason=reason,
            retry_in_s=round(retry_in_s, 2),
            runbook="docs/runbooks.md#outbox-replicas-short",
        )

    def partition_back(self, place: tuple[str, int]) -> None:
        topic, partition = place
        log.info("outbox-partition-back", topic=topic, partition=partition)

    def failed(self, exc: Exception) -> None:
        """Anything else went wrong: the relay stands down (its producer discarded) and backs off."""
        log.warning("outbox-relay-failed", error=describe_error(exc))

    def retrying(self, reason: str, attempt: int, delay_s: float) -> None:
        metrics.outbox_publish_errors_total.labels(reason=reason[:60]).inc()
        log.warning("outbox-relay-retrying", reason=reason, attempt=attempt, delay_s=round(delay_s, 2))
