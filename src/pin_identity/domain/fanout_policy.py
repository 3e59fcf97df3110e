"""Rules of the access fan-out that need no I/O."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


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
