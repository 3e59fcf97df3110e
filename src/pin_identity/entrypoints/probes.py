"""The one readiness check, which `/readyz` of both HTTP servers answers (the worker's own port and `serve`):
ready when the database answers and the broker is reachable, checked at most every few seconds. `serve`
answers the Readiness document (or the problem NOT_READY), the worker the same verdict as a line of text."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from pin_identity.composition import Container
from pin_identity.config import ConfigurationError
from pin_identity.entrypoints.documents import Readiness

NOT_READY = "IDENTITY_NOT_READY"
NOT_READY_DETAIL = "the database or the broker is unreachable"


def _no_warnings() -> str | None:
    return None


class ReadinessCheck:
    """Readiness touches the database and the broker; a probe every few seconds need not, each time. A
    configuration the check cannot use (the broker's properties) is not ready, not a failed probe."""

    def __init__(
        self,
        container: Container,
        *,
        warning: Callable[[], str | None] = _no_warnings,
        ttl_s: float = 5.0,
    ):
        self._container, self._warning, self._ttl_s = container, warning, ttl_s
        self._value, self._at = False, 0.0
        self._lock = threading.Lock()

    def _check(self) -> bool:
        try:
            return self._container.database.ping() and self._container.broker_reachable()
        except ConfigurationError:
            return False

    def ready(self) -> bool:
        with self._lock:
            if time.monotonic() - self._at > self._ttl_s:
                self._value, self._at = self._check(), time.monotonic()
            return self._value

    def answer(self) -> Readiness | None:
        """The readiness document; None when not ready. `warnings` names what is wrong without making the
        process unready (for `serve`, a tokens file that cannot be used)."""
        if not self.ready():
            return None
        warning = self._warning()
        return Readiness(status="ready", warnings=[warning] if warning else [])
