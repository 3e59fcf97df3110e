"""The outbox as the relay reads it (OutboxQueue) and the broker it publishes to (EventPublisher)."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import NamedTuple, Protocol


class PendingEvent(NamedTuple):
    """An outbox row as the relay sends it: ids as text, the value as UTF-8 bytes, ready for the wire."""

    outbox_id: int
    topic: str
    key: str
    value: bytes
    event_type: str
    correlation_id: str
    traceparent: str | None


class ProducerFencedError(Exception):
    """Another producer took the outbox's transactional.id at the broker: a relay of this outbox that took
    over, or (while this relay still holds the lock, where none of this outbox can) a producer outside it."""


# A partition of a topic: where the broker keeps a key's events, in order.
Place = tuple[str, int]
# The reason an event of a topic the broker does not have is handed back with (PublishReport.retry).
TOPIC_MISSING = "UNKNOWN_TOPIC_OR_PART"


@dataclass
class PublishReport:
    """What the broker said about a batch: acknowledged, rejected for good, or to be tried again.

    `failing`: the partitions whose own events failed (partition -> why: too few replicas in sync, no leader,
    a delivery timed out); the other events of `retry` only went down with their transaction (a Kafka
    transaction is all or nothing), and may go again at once.

    And what changed about the topics the relay publishes to since the last report: found missing (topic ->
    why the relay did not recreate it; their events are handed back in `retry` with TOPIC_MISSING until the
    topic exists, never rejected), recreated by the relay, or found again."""

    delivered: list[int] = field(default_factory=list)
    rejected: dict[int, str] = field(default_factory=dict)
    retry: dict[int, str] = field(default_factory=dict)
    failing: dict[Place, str] = field(default_factory=dict)
    topics_missing: dict[str, str] = field(default_factory=dict)
    topics_recreated: list[str] = field(default_factory=list)
    topics_found: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class PublishingHolder:
    """A session whose transaction took an outbox id and has not ended: the relay publishes nothing after
    that id until it does (it holds publishing back, whatever it writes). Its figures are None where the
    relay's role may not see other roles' sessions. A prepared transaction (two-phase commit) has no session:
    it is named by its gid, and its time is since it was prepared; it holds publishing until it is committed
    or rolled back."""

    pid: int | None
    application_name: str | None
    transaction_s: float | None
    prepared_gid: str | None = None


@dataclass(frozen=True)
class OutboxBacklog:
    waiting: int  # rows not yet acknowledged
    oldest_age_s: float  # the age of the oldest of them
    held_s: float = 0.0  # how long the oldest running writer's transaction has run: publishing waits on it
    held_by: PublishingHolder | None = None


class Fetched(NamedTuple):
    """Rows read from the outbox, and how far the read went: every row of the topics asked for, up to
    `upto`, is among `events` or was read before (rows not read yet lie above it)."""

    events: list[PendingEvent]
    upto: int


class RelayRole(StrEnum):
    STANDBY = "standby"  # another relay holds the lock
    ACTIVE = "active"  # this relay holds the lock, and the one before it stood down cleanly
    TAKEN_OVER = "taken_over"  # just took the lock from a relay that did not say its producer was empty


class OutboxBacklogReader(Protocol):
    def backlog(self) -> OutboxBacklog:
        """Rows waiting, the age of the oldest, and the oldest running writer publishing waits on."""
        ...


class OutboxBacklogSession(OutboxBacklogReader, Protocol):
    """A session of its own that reads the backlog (for `/metrics`)."""

    def reset(self) -> None:
        """Close the session; the next read opens another."""
        ...


class OutboxQueue(OutboxBacklogReader, Protocol):
    """The outbox as the one active relay reads and settles it."""

    def try_become_active(self) -> RelayRole:
        """Whether this process is the one active relay (others stand by), and how it became so."""
        ...

    def fetch_ready(
        self, limit: int, after: int, *, max_bytes: int, skip_topics: Collection[str] = ()
    ) -> Fetched:
        """Committed rows with ids above `after`, in outbox order, never past a row that may still commit,
        but for the rows of `skip_topics`; at most `limit` rows and `max_bytes` of values (the first row
        whatever its size). OutboxIdsWentBackError when the id sequence restarted below what this session
        read."""
        ...

    def fetch_topic(self, topic: str, limit: int, after: int, upto: int, *, max_bytes: int) -> Fetched:
        """The rows of one topic between `after` and `upto` (a topic read again after it was held), as
        fetch_ready reads."""
        ...

    def settle(self, delivered: Sequence[int], rejected: Mapping[int, str]) -> None: ...

    def is_drained(self) -> bool:
        """No committed row is left in the outbox."""
        ...

    def still_active(self) -> bool:
        """Whether this relay's session is alive and so still holds the lock (no other relay of this outbox
        can have taken it); never raises."""
        ...

    def heartbeat(self) -> None:
        """Raises when the session (and with it the relay lock) is gone."""
        ...

    def stand_down(self) -> None:
        """Say that nothing this relay handed out can still reach the broker, then drop the session (and
        the lock). Best effort: a session that is already gone cannot say it, and the next relay is then
        TAKEN_OVER (it starts at once all the same: its producer fences this one's)."""
        ...


class EventPublisher(Protocol):
    def start(self) -> None:
        """Start the broker client unless it runs: its handshake then overlaps the caller's first reads."""
        ...

    def partition(self, topic: str, key: str) -> int | None:
        """The partition the event of `key` goes to; None where the broker's layout or the partitioner
        does not tell."""
        ...

    def unwritable(self, places: Collection[Place]) -> dict[Place, str]:
        """Of these partitions, those the broker says cannot take a write now (no leader, too few replicas
        in sync), with why; empty when it does not say."""
        ...

    def look_for(self, topics: Collection[str]) -> PublishReport:
        """Ask the broker again about topics found missing: the report says which are back (found, or
        recreated by the publisher) and which are still missing."""
        ...

    def send(self, events: Sequence[PendingEvent]) -> PublishReport:
        """Hand events to the broker client; the report holds only what failed at once."""
        ...

    def collect(self, timeout_s: float) -> PublishReport:
        """What the broker answered since the last call, waiting up to timeout_s for a first answer. A wait
        says the relay has nothing more to hand over for now: a publisher that batches (a transaction) sends
        what it holds at once."""
        ...

    def discard(self) -> None:
        """Drop everything the client still holds and the client itself (its connections close), so that
        nothing handed to it before can reach the broker later."""
        ...

    def replication_shortfall(self) -> str | None:
        """Why the broker takes no write to the relay's topics, where its metadata says so (fewer replicas
        in sync than a topic's min.insync.replicas), in one line; None otherwise. Asked when publishing keeps
        failing: the client only retries such a refusal until the delivery times out, and says no more."""
        ...
