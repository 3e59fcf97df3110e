"""The one readiness check both HTTP servers answer on `/readyz`: asked at most once per interval, a
configuration it cannot use is "not ready" (not a failed probe), and warnings ride along a ready answer."""

from __future__ import annotations

from pin_identity.adapters.system_clock import SYSTEM_CLOCK
from pin_identity.config import ConfigurationError
from pin_identity.entrypoints.documents import Problem, Readiness
from pin_identity.entrypoints.readiness import NOT_READY, ReadinessCheck, readiness_reply
from tests.support.clocks import ManualClock


class Dependencies:
    def __init__(self) -> None:
        self.up, self.asked = True, 0

    def __call__(self) -> bool:
        self.asked += 1
        return self.up


def test_the_dependencies_are_asked_at_most_once_per_interval() -> None:
    dependencies, clock = Dependencies(), ManualClock()
    check = ReadinessCheck(dependencies, ttl_s=5.0, clock=clock)
    assert check.answer() == Readiness(status="ready", warnings=[])
    dependencies.up = False
    clock.advance(4.0)
    assert check.ready() and dependencies.asked == 1
    clock.advance(2.0)
    assert check.answer() is None and dependencies.asked == 2


def test_a_configuration_the_check_cannot_use_is_not_ready() -> None:
    def unusable() -> bool:
        raise ConfigurationError("PIN_IDENTITY_KAFKA_CONFIG: unknown property")

    assert ReadinessCheck(unusable, clock=ManualClock()).answer() is None


def test_a_warning_rides_along_a_ready_answer_and_not_an_unready_one() -> None:
    dependencies = Dependencies()
    check = ReadinessCheck(
        dependencies, warning=lambda: "the tokens file cannot be read", ttl_s=0.0, clock=SYSTEM_CLOCK
    )
    assert check.answer() == Readiness(status="ready", warnings=["the tokens file cannot be read"])
    dependencies.up = False
    assert check.answer() is None


def test_both_servers_reply_with_one_document_ready_or_the_not_ready_problem() -> None:
    dependencies = Dependencies()
    check = ReadinessCheck(dependencies, ttl_s=0.0, clock=SYSTEM_CLOCK)
    assert readiness_reply(check) == (200, Readiness(status="ready", warnings=[]))
    dependencies.up = False
    status, problem = readiness_reply(check, "/readyz")
    assert status == 503 and isinstance(problem, Problem)
    assert (problem.code, problem.status, problem.instance) == (NOT_READY, 503, "/readyz")
