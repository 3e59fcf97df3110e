"""What the jobs need from the outside world; adapters implement these."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
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


@dataclass
class PublishReport:
    """What the broker said about a batch: acknowledged, rejected for good, or to be tried again."""

    delivered: list[int] = field(default_factory=list)
    rejected: dict[int, str] = field(default_factory=dict)
    retry: dict[int, str] = field(default_factory=dict)


class OutboxQueue(Protocol):
    def try_become_active(self) -> bool:
        """True while this process is the one active relay (others stand by)."""
        ...

    def fetch_ready(self, limit: int, exclude: Collection[int]) -> list[PendingEvent]:
        """Committed rows in outbox order, leaving out those already handed to the publisher."""
        ...

    def settle(self, delivered: Sequence[int], rejected: Mapping[int, str]) -> None: ...
    def reset(self) -> None:
        """Drop the session after an error; the next call starts a new one."""
        ...


class EventPublisher(Protocol):
    def send(self, events: Sequence[PendingEvent]) -> PublishReport:
        """Hand events to the broker client; the report holds only what failed at once."""
        ...

    def collect(self, timeout_s: float) -> PublishReport:
        """What the broker answered since the last call, waiting up to timeout_s for a first answer."""
        ...


class StopSignal(Protocol):
    def is_set(self) -> bool: ...
    def wait(self, timeout: float | None = None) -> bool: ...
