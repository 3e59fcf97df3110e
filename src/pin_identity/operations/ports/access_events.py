"""Writing UserAccessChanged events: a port of its own, because every transaction that changes access (an
operator's, a replica batch's) writes them the same way."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol
from uuid import UUID

from pin_identity.domain.events import OutboxMessage
from pin_identity.domain.model import UserAccessSnapshot


class AccessEventWriter(Protocol):
    """What writing UserAccessChanged events takes, inside any transaction that changed access."""

    def access_snapshots(self, user_ids: Sequence[UUID]) -> list[UserAccessSnapshot]: ...
    def access_versions(self, user_ids: Sequence[UUID]) -> dict[UUID, int]: ...
    def add_events(self, messages: Sequence[OutboxMessage]) -> None: ...
