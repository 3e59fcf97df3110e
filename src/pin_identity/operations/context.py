"""Who asked and when, for every use case that writes events: the identity changes an operator makes and the
Talent replica's (a sync, an import page, a replay) alike, so it sits beside both rather than in either."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from pin_identity.domain.clock import Clock


@dataclass(frozen=True)
class Context:
    """Who asked and when: every event of the operation carries this correlation id and time, and the W3C
    traceparent of the span the operation runs in (None when it runs in none, or tracing is off)."""

    correlation_id: UUID
    now: datetime
    traceparent: str | None = None

    @classmethod
    def fresh(cls, clock: Clock) -> Context:
        return cls(correlation_id=uuid.uuid4(), now=clock.now())
