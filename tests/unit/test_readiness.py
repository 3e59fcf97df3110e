"""The one readiness check both HTTP servers answer on `/readyz`: asked at most once per interval, a
configuration it cannot use is "not ready" (not a failed probe), and warnings ride along a ready answer."""

from __future__ import annotations

from pin_identity.config import ConfigurationError
from pin_identity.entrypoints.documents import Readiness
from pin_identity.entrypoints.probes import ReadinessCheck


class Dependencies:
    def __init__(self) -> None:
        self.up, self.asked = True, 0

    def __call__(self) -> bool:
        self.asked += 1
        return self.up


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_dependencies_are_asked_at_most_once_per_interval() -> None:
    dependencies, clock = Dependencies(), Clock()
    check = ReadinessCheck(dependencies, ttl_s=5.0, clock=clock)
    assert check.answer() == Readiness(status="ready", warnings=[])
    dependencies.up = False
    clock.now += 4.0
    assert check.ready() and dependencies.asked == 1
    clock.now += 2.0
    assert check.answer() is None and dependencies.asked == 2


def test_a_configuration_the_check_cannot_use_is_not_ready() -> None:
    def unusable() -> bool:
        raise ConfigurationError("PIN_IDENTITY_KAFKA_CONFIG: unknown property")

    assert ReadinessCheck(unusable).answer() is None


def test_a_warning_rides_along_a_ready_answer_and_not_an_unready_one() -> None:
    dependencies = Dependencies()
    check = ReadinessCheck(dependencies, warning=lambda: "the tokens file cannot be read", ttl_s=0.0)
    assert check.answer() == Readiness(status="ready", warnings=["the tokens file cannot be read"])
    dependencies.up = False
    assert check.answer() is None
