"""Exponential back-off: how long to wait after the n-th failure in a row, the one formula of every retry."""

from __future__ import annotations

import random
from dataclasses import dataclass

# Beyond this the delay is the cap for any sane base and cap; a float power past ~1024 would overflow.
_MAX_EXPONENT = 64


@dataclass(frozen=True)
class Backoff:
    """`base_s` after the first failure, `factor` times more after each further one, never over `cap_s`.

    `jitter` is the share of a delay a random draw may take off: callers that fail together (threads sharing
    one client) then do not retry together.
    """

    base_s: float
    cap_s: float
    factor: float = 2.0
    jitter: float = 0.0

    def __post_init__(self) -> None:
        if self.base_s < 0 or self.cap_s < 0 or self.factor < 1 or not 0 <= self.jitter <= 1:
            raise ValueError(f"not a back-off: {self}")

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """Seconds to wait after failure number `attempt` (1 for the first); with `rng`, jittered."""
        ceiling = min(self.cap_s, self.base_s * self.factor ** min(attempt - 1, _MAX_EXPONENT))
        if rng is None or not self.jitter:
            return ceiling
        return ceiling * rng.uniform(1.0 - self.jitter, 1.0)
