"""Waiting for a process started by a test to serve its health endpoint; reading its metrics."""

from __future__ import annotations

import re

import httpx

from tests.support.waiting import first_answer


def metric(scrape: str, name: str) -> float:
    """The sum of a metric's samples (every label) in a Prometheus scrape."""
    return sum(float(m) for m in re.findall(rf"^{name}(?:{{[^}}]*}})? (\S+)$", scrape, re.MULTILINE))


def wait_for_healthz(base: str, who: str, timeout_s: float = 30) -> httpx.Response:
    """The first answer of `{base}/healthz`; connection errors until then are the process still starting."""

    def healthz() -> httpx.Response | None:
        try:
            return httpx.get(f"{base}/healthz", timeout=2)
        except httpx.TransportError:
            return None

    return first_answer(healthz, f"{who} answered /healthz", timeout_s=timeout_s, every_s=0.1)
