"""What a worker runs (a Job) and how it is told to stop (a StopSignal, a threading.Event in production)."""

from __future__ import annotations

from typing import Protocol


class StopSignal(Protocol):
    def is_set(self) -> bool: ...
    def wait(self, timeout: float | None = None) -> bool: ...


class Job(Protocol):
    """A job's loop: it runs until `stop` is set, or with `once` until it finds nothing left to do."""

    def run(self, stop: StopSignal, *, once: bool = False) -> None: ...
