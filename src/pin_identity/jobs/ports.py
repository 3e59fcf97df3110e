"""What the jobs need from the outside world; adapters implement these."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from pin_identity.domain.events import OutboxMessage


@dataclass(frozen=True)
class PendingEvent:
    """An outbox row: its position in the outbox and the message to send."""

    outbox_id: int
    message: OutboxMessage


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

    def fetch_ready(self, limit: int) -> list[PendingEvent]: ...
    def settle(self, delivered: Sequence[int], rejected: Mapping[int, str]) -> None: ...
    def reset(self) -> None:
        """Drop the session after an error; the next call starts a new one."""
        ...


class EventPublisher(Protocol):
    def publish(self, events: Sequence[PendingEvent], should_stop: Callable[[], bool]) -> PublishReport: ...


class StopSignal(Protocol):
    def is_set(self) -> bool: ...
    def wait(self, timeout: float | None = None) -> bool: ...
