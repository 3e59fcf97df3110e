"""The console's reads through the operator service, over in-memory ports: a role that is not there, the
consumer lag when the broker answers and when it does not, the health summary as a whole."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from contextlib import AbstractContextManager
from datetime import UTC, datetime
from uuid import UUID

import pytest

from pin_identity.domain.errors import BrokerUnavailableError, NotFoundError
from pin_identity.domain.fanout_policy import FanOutPolicy
from pin_identity.domain.model import RoleStatus
from pin_identity.operations.health_reads import HealthReads, QueueGauges
from pin_identity.operations.ports.health_sources import DeadLetters, PartitionLagView
from pin_identity.operations.ports.identity_records import IdentityTransaction, RoleView
from pin_identity.operations.ports.outbox import PublishingHolder
from pin_identity.operations.role_admin import RoleAdmin
from tests.support.clocks import ManualClock

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
GROUP = "pin-identity-talent-sync"
TOPICS = ("talent.tenants.v1", "talent.users.v1")


class MemoryReads:
    """RoleSummaries and DeadLetterReads in memory."""

    def __init__(self, roles: Sequence[RoleView] = ()):
        self._roles = list(roles)

    def roles(
        self, *, role_id: UUID | None = None, code: str | None = None, limit: int = 100
    ) -> list[RoleView]:
        found = [r for r in self._roles if role_id in (None, r.role_id) and code in (None, r.code)]
        return found[:limit]

    def dead_letters(self) -> DeadLetters:
        return DeadLetters(3, NOW)


class MemoryLags:
    def __init__(self, lags: Sequence[PartitionLagView] = (), unavailable: str | None = None):
        self._lags, self._unavailable = list(lags), unavailable
        self.asked: list[tuple[str, tuple[str, ...]]] = []

    def partition_lags(self, group: str, topics: Sequence[str]) -> list[PartitionLagView]:
        self.asked.append((group, tuple(topics)))
        if self._unavailable is not None:
            raise BrokerUnavailableError(self._unavailable)
        return self._lags


def _role(code: str) -> RoleView:
    return RoleView(
        role_id=uuid.uuid4(),
        code=code,
        name=code.title(),
        company_id=None,
        company_name=None,
        status=RoleStatus.ACTIVE,
        version=1,
        permissions=["a.read"],
        holders=2,
    )


def _lag(topic: str, lag: int, committed: int | None) -> PartitionLagView:
    return PartitionLagView(topic=topic, partition=0, lag=lag, committed_offset=committed)


def _no_transactions() -> AbstractContextManager[IdentityTransaction]:
    raise AssertionError("reads open no transaction")


def test_a_role_is_found_by_id_and_an_unknown_one_is_not_found() -> None:
    known = _role("developer-manager")
    admin = RoleAdmin(
        _no_transactions, FanOutPolicy(100), MemoryReads([known, _role("viewer")]), ManualClock(NOW)
    )
    assert admin.role(known.role_id) == known
    assert [r.code for r in admin.roles(code="viewer")] == ["viewer"]
    unknown = uuid.uuid4()
    with pytest.raises(NotFoundError, match=f"role {unknown} does not exist"):
        admin.role(unknown)


def test_the_consumer_lag_totals_the_partitions_of_the_group_on_its_topics() -> None:
    lags = MemoryLags([_lag(TOPICS[0], 5, 10), _lag(TOPICS[1], 7, None)])
    health = HealthReads(MemoryReads(), lags, GROUP, TOPICS)
    lag = health.consumer_lag()
    assert (lag.group, lag.total, lag.error, len(lag.partitions)) == (GROUP, 12, None, 2)
    assert lags.asked == [(GROUP, TOPICS)]
    assert health.dead_letters() == DeadLetters(3, NOW)


def test_a_broker_that_does_not_say_makes_the_lag_unknown_not_the_summary_fail() -> None:
    health = HealthReads(MemoryReads(), MemoryLags(unavailable="broker timed out"), GROUP, TOPICS)
    lag = health.consumer_lag()
    assert (lag.total, lag.partitions, lag.error) == (None, [], "broker timed out")


def test_no_partitions_yet_is_a_lag_of_zero_not_an_unknown_one() -> None:
    lag = HealthReads(MemoryReads(), MemoryLags(), GROUP, TOPICS).consumer_lag()
    assert (lag.total, lag.error) == (0, None)


def test_the_health_summary_is_the_gauges_as_read_with_dead_letters_and_lag() -> None:
    """The document shows the figures the gauges were read with (no round trip through the registry)."""
    held = PublishingHolder(pid=42, application_name="pin-identity", transaction_s=1.5)
    queues = QueueGauges(7, 2.5, 1.5, held, fanout_backlog=3, fanout_failed=1, import_started_at=NOW)
    lags = MemoryLags([_lag(TOPICS[0], 5, 10)])
    summary = HealthReads(MemoryReads(), lags, GROUP, TOPICS).report(queues, NOW).model_dump(mode="json")
    assert summary == {
        "outboxBacklog": 7,
        "outboxOldestAgeSeconds": 2.5,
        "outboxPublishingHeldSeconds": 1.5,
        "outboxHeldBy": {
            "pid": 42,
            "applicationName": "pin-identity",
            "transactionSeconds": 1.5,
            "preparedGid": None,
        },
        "fanoutBacklog": 3,
        "fanoutFailed": 1,
        "importRunning": True,
        "deadLetters": 3,
        "newestDeadLetterAt": "2026-03-01T12:00:00Z",
        "consumerLag": {
            "group": GROUP,
            "total": 5,
            "partitions": [{"topic": TOPICS[0], "partition": 0, "lag": 5, "committedOffset": 10}],
            "error": None,
        },
        "readAt": "2026-03-01T12:00:00Z",
    }
    idle = QueueGauges(0, 0.0, 0.0, None, fanout_backlog=0, fanout_failed=0, import_started_at=None)
    quiet = HealthReads(MemoryReads(), lags, GROUP, TOPICS).report(idle, NOW)
    assert (quiet.outbox_held_by, quiet.import_running) == (None, False)
