"""Waiting for a process started by a test to serve its health endpoint; reading its metrics."""

from __future__ import annotations

import re
import time

import httpx


def metric(scrape: str, name: str) -> float:
    """The sum of a metric's samples (every label) in a Prometheus scrape."""
    return sum(float(m) for m in re.findall(rf"^{name}(?:{{[^}}]*}})? (\S+)$", scrape, re.MULTILINE))


def wait_for_healthz(base: str, who: str, timeout_s: float = 30) -> httpx.Response:
    """The first answer of `{base}/healthz`; connection errors until then are the process still starting."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return httpx.get(f"{base}/healthz", timeout=2)
        except httpx.TransportError:
            assert time.monotonic() < deadline, f"{who} never answered /healthz"
            time.sleep(0.1)
