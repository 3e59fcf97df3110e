"""The lease rules' values (pin_identity.domain.lease), from a `now` passed in: a lease's end, a release's
availability after its back-off; and each queue's rules as its settings make them.
tests/integration/test_lease_rules.py holds both queues' statements to the same rules."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from pin_identity.config import FanOutSettings, ImportSettings
from pin_identity.domain.backoff import Backoff
from pin_identity.domain.lease import LeaseRules, Release

NOW = datetime(2031, 5, 1, 9, 0, tzinfo=UTC)
RULES = LeaseRules(timedelta(seconds=60), max_attempts=3, backoff=Backoff(base_s=2.0, cap_s=60.0))


def test_a_lease_ends_its_length_after_the_claim_or_the_renewal() -> None:
    assert RULES.until(NOW) == NOW + timedelta(seconds=60)
    assert RULES.until(NOW + timedelta(hours=1)) == NOW + timedelta(hours=1, seconds=60)


def test_a_failed_attempt_is_released_after_its_back_off_which_grows_with_the_attempts() -> None:
    releases = [RULES.release(NOW, attempt, count_attempt=True, error="e") for attempt in (1, 2, 6)]
    assert [release.available_at - NOW for release in releases] == [timedelta(seconds=s) for s in (2, 4, 60)]
    assert releases[0] == Release(NOW + timedelta(seconds=2), count_attempt=True, error="e")


def test_a_release_that_does_not_count_is_available_at_once() -> None:
    assert RULES.release(NOW, 2, count_attempt=False, error=None) == Release(NOW, False, None)


def test_the_fanout_waits_two_seconds_doubling_never_longer_than_a_lease() -> None:
    rules = FanOutSettings(max_lease_s=300, max_attempts=5).lease_rules
    assert (rules.length, rules.max_attempts) == (timedelta(seconds=300), 5)
    delays = [rules.retry_delay(n).total_seconds() for n in (1, 2, 3, 8, 9, 30)]
    assert delays == [2, 4, 8, 256, 300, 300]


def test_an_import_page_has_its_lease_attempts_and_back_off_from_the_import_settings() -> None:
    settings = ImportSettings(page_lease_s=600, max_page_attempts=4, backoff_base_s=1.0, backoff_max_s=60.0)
    rules = settings.lease_rules
    assert (rules.length, rules.max_attempts, rules.backoff) == (timedelta(seconds=600), 4, settings.backoff)
