from __future__ import annotations

import random

import pytest

from pin_identity.domain.backoff import Backoff


def test_the_delay_starts_at_the_base_and_doubles() -> None:
    backoff = Backoff(base_s=0.5, cap_s=100.0)
    assert [backoff.delay(n) for n in (1, 2, 3, 4, 5)] == [0.5, 1.0, 2.0, 4.0, 8.0]


def test_the_delay_never_passes_the_cap() -> None:
    backoff = Backoff(base_s=1.0, cap_s=60.0)
    assert [backoff.delay(n) for n in (6, 7, 8, 50)] == [32.0, 60.0, 60.0, 60.0]


def test_any_number_of_failures_waits_the_cap() -> None:
    """A dependency away for days: the count keeps growing, the float power must not overflow."""
    assert Backoff(base_s=0.5, cap_s=30.0).delay(100_000) == 30.0


def test_another_factor() -> None:
    assert [Backoff(base_s=1.0, cap_s=1000.0, factor=3.0).delay(n) for n in (1, 2, 3)] == [1.0, 3.0, 9.0]


def test_jitter_takes_off_at_most_its_share_and_only_with_a_random_source() -> None:
    backoff = Backoff(base_s=2.0, cap_s=5.0, jitter=0.5)
    assert backoff.delay(3) == 5.0
    draws = [backoff.delay(3, random.Random(seed)) for seed in range(200)]
    assert all(2.5 <= d <= 5.0 for d in draws)
    assert len(set(draws)) > 100


@pytest.mark.parametrize(
    "fields",
    [
        {"base_s": -1.0, "cap_s": 1.0},
        {"base_s": 1.0, "cap_s": 1.0, "factor": 0.5},
        {"base_s": 1.0, "cap_s": 1.0, "jitter": 2.0},
    ],
)
def test_nonsense_is_refused(fields: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="not a back-off"):
        Backoff(**fields)
