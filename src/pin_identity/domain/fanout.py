"""Rules of the access fan-out that need no I/O."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from enum import StrEnum

from pin_identity.domain.backoff import Backoff


class FanOutPath(StrEnum):
    INLINE = "inline"
    QUEUED = "queued"


@dataclass(frozen=True)
class FanOutPolicy:
    """InlineFanOutThreshold: a role of at most this many unique active users is notified inline."""

    inline_threshold: int

    def path_for(self, unique_active_users: int) -> FanOutPath:
        if unique_active_users <= self.inline_threshold:
            return FanOutPath.INLINE
        return FanOutPath.QUEUED

    @property
    def users_to_count(self) -> int:
        """Counting past threshold + 1 users cannot change the decision, so the count stops there."""
        return self.inline_threshold + 1


@dataclass(frozen=True)
class FanOutSettings:
    """PollingInterval, BatchSize, MaxLeaseDuration, MaxAttempts (CONTRACTS section 1): their defaults,
    which the PIN_IDENTITY_FANOUT_* variables override (config.py)."""

    polling_interval_s: float = 5.0
    batch_size: int = 500
    max_lease_s: int = 300
    max_attempts: int = 5
    # Events waiting in the outbox (the relay's in flight among them) above which the next page waits for
    # the relay, at most outbox_wait_max_s a page (0: never). A point change commits behind every event
    # already waiting, so a fan-out that outruns the relay delays it (BENCHMARKS.md, "A point change
    # during a fan-out"); it costs a million-user fan-out about an eighth of its time.
    outbox_backlog_limit: int = 10_000
    outbox_wait_max_s: float = 5.0

    @property
    def lease(self) -> timedelta:
        return timedelta(seconds=self.max_lease_s)

    def retry_delay(self, attempt: int) -> timedelta:
        """After a failed attempt the task waits a little (2 s, doubling), never longer than a lease."""
        return timedelta(seconds=Backoff(base_s=2.0, cap_s=self.max_lease_s).delay(attempt))
