"""What the two HTTP servers' `/readyz` share (the worker's own and `serve`'s)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class ReadinessCache:
    """Readiness touches the database and the broker; a probe every few seconds need not, each time."""

    def __init__(self, check: Callable[[], bool], ttl_s: float = 5.0):
        self._check, self._ttl_s = check, ttl_s
        self._value, self._at = False, 0.0
        self._lock = threading.Lock()

    def __call__(self) -> bool:
        with self._lock:
            if time.monotonic() - self._at > self._ttl_s:
                self._value, self._at = self._check(), time.monotonic()
            return self._value
