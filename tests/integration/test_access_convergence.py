"""CONTRACTS section 4, convergence: the last UserAccessChanged of every user carries their current truth,
whatever committed meanwhile. A point revoke is held at its COMMIT (the widest window) while a snapshot
writer reads: the writer must wait for it, so its event (carrying the revoke) comes after the revoke's."""

from __future__ import annotations

import threading
from datetime import UTC, datetime

import pytest

from pin_identity.adapters.system_clock import SYSTEM_CLOCK
from pin_identity.composition import Container
from pin_identity.composition.stores import Stores
from pin_identity.domain.fanout_policy import FanOutPath, FanOutPolicy
from pin_identity.operations import identity_changes
from pin_identity.operations.context import Context
from pin_identity.operations.documents import PermissionsChanged
from tests.support import seed
from tests.support.clocks import ManualClock
from tests.support.convergence import Background, CommitHold, assert_converged
from tests.support.fanout import fanout_job
from tests.support.kafka_tap import EventTap
from tests.support.relay import publish_outbox
from tests.support.waiting import wait_until


@pytest.mark.parametrize("path", [FanOutPath.QUEUED, FanOutPath.INLINE])
def test_a_role_wide_snapshot_never_overtakes_a_point_revoke_that_commits_meanwhile(
    path: FanOutPath, container: Container, stores: Stores, tap: EventTap, database_url: str
) -> None:
    company = seed.company(stores.identity_transactions)
    role = seed.role(stores.identity_transactions, company, code="developer-manager-local")
    users = [seed.user(stores.identity_transactions, company) for _ in range(3)]
    grants = [seed.grant(stores.identity_transactions, user, role, company) for user in users]
    threshold = 0 if path is FanOutPath.QUEUED else 200
    policy = FanOutPolicy(threshold)
    if path is FanOutPath.QUEUED:
        change = _set_permissions(container, role, policy)
        assert change.path is FanOutPath.QUEUED

    hold = CommitHold(database_url)
    try:
        revoke = Background(
            lambda: identity_changes.revoke_role_assignment(
                stores.identity_transactions, Context.fresh(SYSTEM_CLOCK), grants[1]
            )
        )
        # The revoke did its work and waits at COMMIT.
        wait_until(lambda: hold.waiting() >= 1, "the revoke waits at its commit")
        if path is FanOutPath.QUEUED:
            job = fanout_job(container, ManualClock(datetime.now(UTC)), batch_size=50)
            writer = Background(lambda: job.step(threading.Event()))
        else:
            writer = Background(lambda: _set_permissions(container, role, policy))
        # The snapshot writer either waits for the revoke's user (the fix) or commits without it.
        wait_until(lambda: writer.done or hold.waiting() >= 2, "the snapshot writer waits or is done")
    finally:
        hold.release()
    revoke.join()
    writer.join()
    publish_outbox(container)
    assert_converged(tap, database_url, users)


def _set_permissions(container: Container, role: object, policy: FanOutPolicy) -> PermissionsChanged:
    return seed.change_permissions(
        container.stores.identity_transactions,
        role,  # type: ignore[arg-type]
        ["deals.read", "deals.write"],
        policy,
    )
