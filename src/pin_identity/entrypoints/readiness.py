"""The one readiness check, which `/readyz` of both HTTP servers answers (the worker's own port and `serve`):
ready when the database answers and the broker is reachable, checked at most every few seconds. `serve`
and the worker answer the same document: Readiness, or the problem NOT_READY (`readiness_reply`)."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable

from pin_identity.composition import Container
from pin_identity.config import ConfigurationError
from pin_identity.domain.api_model import ApiModel
from pin_identity.domain.clock import Clock
from pin_identity.entrypoints.documents import Problem, Readiness

NOT_READY = "IDENTITY_NOT_READY"
NOT_READY_DETAIL = "the database or the broker is unreachable"


def _no_warnings() -> str | None:
    return None


class ReadinessCheck:
    """Readiness touches the database and the broker; a probe every few seconds need not, each time. A
    configuration the check cannot use (the broker's properties) is not ready, not a failed probe."""

    def __init__(
        self,
        check: Callable[[], bool],
        *,
        warning: Callable[[], str | None] = _no_warnings,
        ttl_s: float = 5.0,
        clock: Clock,
    ):
        self._check, self._warning, self._ttl_s, self._clock = check, warning, ttl_s, clock
        self._value, self._at = False, -math.inf
        self._lock = threading.Lock()

    @classmethod
    def of(cls, container: Container, *, warning: Callable[[], str | None] = _no_warnings) -> ReadinessCheck:
        """Ready when the database answers and the broker is reachable."""
        return cls(
            lambda: container.connections.database.ping() and container.connections.broker_reachable(),
            warning=warning,
            clock=container.clock,
        )

    def _answered(self) -> bool:
        try:
            return self._check()
        except ConfigurationError:
            return False

    def ready(self) -> bool:
        with self._lock:
            if self._clock.monotonic() - self._at > self._ttl_s:
                self._value, self._at = self._answered(), self._clock.monotonic()
            return self._value

    def answer(self) -> Readiness | None:
        """The readiness document; None when not ready. `warnings` names what is wrong without making the
        process unready (for `serve`, a tokens file that cannot be used)."""
        if not self.ready():
            return None
        warning = self._warning()
        return Readiness(status="ready", warnings=[warning] if warning else [])


def readiness_reply(check: ReadinessCheck, path: str = "/readyz") -> tuple[int, ApiModel]:
    """What `/readyz` answers on either server: 200 and the Readiness document, or 503 and the problem."""
    answer = check.answer()
    if answer is None:
        return 503, Problem.answering(503, NOT_READY, NOT_READY_DETAIL, path)
    return 200, answer
