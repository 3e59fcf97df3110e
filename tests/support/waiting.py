"""Waiting on a state instead of sleeping: poll a condition until it holds, fail the test when it does not."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(condition: Callable[[], bool], what: str, *, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout_s:g} s waiting until {what}"
        time.sleep(0.02)
