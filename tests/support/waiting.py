"""Waiting on a state instead of sleeping: poll a condition until it holds, fail the test when it does not.

`every_s` is the pause between two looks; 0 where looking blocks by itself (a consumer's poll, a delivery's
collect), so that nothing is added to the wait it already makes."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(
    condition: Callable[[], bool], what: str, *, timeout_s: float = 30.0, every_s: float = 0.02
) -> None:
    assert holds_within(condition, timeout_s, every_s=every_s), (
        f"timed out after {timeout_s:g} s waiting until {what}"
    )


def holds_within(condition: Callable[[], bool], timeout_s: float, *, every_s: float = 0.02) -> bool:
    """Whether `condition` came to hold before `timeout_s` passed: for a wait the test judges by what it
    finds after it (with a message of its own, or as one of several outcomes)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() >= deadline:
            return False
        time.sleep(every_s)
    return True


def first_answer(
    ask: Callable[[], T | None], what: str, *, timeout_s: float = 30.0, every_s: float = 0.02
) -> T:
    """The first answer of `ask` that is not None (None: not yet)."""
    answers: list[T] = []

    def answered() -> bool:
        answer = ask()
        if answer is not None:
            answers.append(answer)
        return bool(answers)

    wait_until(answered, what, timeout_s=timeout_s, every_s=every_s)
    return answers[0]
