"""Property: any interleaving, duplication, reordering and batching of a set of Talent snapshots converges on
the state of each entity's highest version, with one default role per live user and no event for a skip.

Applied the way the continuous consumer applies them (tenants before users inside a batch, users whose tenant
is missing deferred and retried), on the real database. A deleted entity may end Blocked or absent (deleting
what the replica never had is a skip, by the spec); the generator's only constraint is that an entity's first
arrival is a live snapshot, so that the replica meets each entity at all.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pin_identity.adapters.system_clock import SYSTEM_CLOCK
from pin_identity.composition import Container
from pin_identity.domain.talent import ItemResult
from pin_identity.operations.context import Context
from pin_identity.operations.ports.replica import SourceItem
from pin_identity.operations.talent_replica import ApplyOptions, BatchOutcome, apply_snapshots, retry_deferred
from tests.support import talent

TENANTS = [uuid.UUID(int=i, version=4) for i in (1, 2)]
USERS = [uuid.UUID(int=i, version=4) for i in (11, 12, 13)]
PHONES = {user: [f"+7916{n:03d}{k:04d}" for k in (1, 2)] for n, user in enumerate(USERS)}
NAMES = ["Альфа", "Бета", "Гамма"]


@st.composite
def _versions(draw: st.DrawFn, entity: uuid.UUID, make: Any) -> list[dict[str, Any]]:
    count = draw(st.integers(1, 3))
    return [make(draw, entity, version) for version in range(1, count + 1)]


def _tenant(draw: st.DrawFn, tenant_id: uuid.UUID, version: int) -> dict[str, Any]:
    deleted = version > 1 and draw(st.booleans())
    return talent.tenant(tenant_id, version=version, name=draw(st.sampled_from(NAMES)), isDeleted=deleted)


def _user(draw: st.DrawFn, user_id: uuid.UUID, version: int) -> dict[str, Any]:
    return talent.user(
        str(draw(st.sampled_from(TENANTS))),
        user_id,
        version=version,
        phone=draw(st.sampled_from(PHONES[user_id])),
        firstName=draw(st.sampled_from(NAMES)),
        isDeleted=version > 1 and draw(st.booleans()),
    )


@st.composite
def _deliveries(draw: st.DrawFn) -> tuple[list[dict[str, Any]], list[list[dict[str, Any]]]]:
    """Every snapshot (the set) and how they arrive: reordered, some twice, cut into batches."""
    snapshots = [s for t in TENANTS for s in draw(_versions(t, _tenant))]
    snapshots += [s for u in USERS for s in draw(_versions(u, _user))]
    arrivals = draw(st.permutations(snapshots)) + draw(st.lists(st.sampled_from(snapshots), max_size=4))
    arrivals = _live_first(list(arrivals))
    cuts = sorted(draw(st.lists(st.integers(0, len(arrivals)), max_size=5)))
    edges = [0, *cuts, len(arrivals)]
    return snapshots, [arrivals[a:b] for a, b in itertools.pairwise(edges)]


def _entity(snapshot: dict[str, Any]) -> str:
    return str(snapshot.get("userId", snapshot["tenantId"]))


def _live_first(arrivals: list[dict[str, Any]]) -> list[dict[str, Any]]:
    for entity in {_entity(s) for s in arrivals}:
        positions = [i for i, s in enumerate(arrivals) if _entity(s) == entity]
        live = next(i for i in positions if not arrivals[i]["isDeleted"])
        arrivals[positions[0]], arrivals[live] = arrivals[live], arrivals[positions[0]]
    return arrivals


def _consume(container: Container, batch: list[dict[str, Any]]) -> list[BatchOutcome]:
    ctx = Context.fresh(SYSTEM_CLOCK)
    options = ApplyOptions(retry_at=lambda attempt: ctx.now)
    items = [SourceItem(talent.raw(snapshot)) for snapshot in batch]
    with container.stores.replica_transactions() as tx:
        outcome = apply_snapshots(tx, items, ctx, options)  # the batch's tenants before its users
        tx.commit()
    return [outcome, *_retry_deferred(container)]


def _retry_deferred(container: Container) -> list[BatchOutcome]:
    ctx = Context(uuid.uuid4(), SYSTEM_CLOCK.now() + timedelta(days=1))
    with container.stores.replica_transactions() as tx:
        outcome = retry_deferred(tx, ctx, ApplyOptions(retry_at=lambda _: ctx.now), 100)
        tx.commit()
    return [outcome]


def _expected(snapshots: list[dict[str, Any]]) -> dict[str, list[tuple[Any, ...]]]:
    """A deletion carries no fields: a deleted entity is (id, "Blocked", version), or absent from the replica
    when its deletion arrived before any live version could be applied (deleting the absent is a skip)."""
    newest: dict[str, dict[str, Any]] = {}
    for snapshot in snapshots:
        if snapshot["version"] > newest.get(_entity(snapshot), {"version": 0})["version"]:
            newest[_entity(snapshot)] = snapshot
    state: dict[str, list[tuple[Any, ...]]] = {"companies": [], "users": [], "deleted": []}
    for entity, s in sorted(newest.items()):
        if s["isDeleted"]:
            state["deleted"].append((entity, "Blocked", s["version"]))
        elif "userId" not in s:
            state["companies"].append((entity, "Active", s["version"], s["name"]))
        else:
            # A manager holds its company's default role only while the company is not Blocked.
            tenant_live = not newest[str(s["tenantId"])]["isDeleted"]
            roles = [f"developer-manager@{s['tenantId']}"] if tenant_live else None
            state["users"].append(
                (entity, "Invited", s["version"], s["tenantId"], s["phone"], s["firstName"], roles)
            )
    return state


def _actual(container: Container) -> dict[str, list[tuple[Any, ...]]]:
    replica = talent.replica_state(container)
    state: dict[str, list[tuple[Any, ...]]] = {"companies": [], "users": [], "deleted": []}
    for c in replica["companies"]:
        blocked = c[3] == "Blocked"
        state["deleted" if blocked else "companies"].append(
            (c[0], c[3], c[6]) if blocked else (c[0], c[3], c[6], c[1])
        )
    for u in replica["users"]:
        blocked = u[3] == "Blocked" and u[12] is None
        state["deleted" if blocked else "users"].append(
            (u[0], u[3], u[11]) if blocked else (u[0], u[3], u[11], u[1], u[4], u[6], u[12])
        )
    state["deleted"].sort()
    return state


def _converged(actual: dict[str, list[tuple[Any, ...]]], expected: dict[str, list[tuple[Any, ...]]]) -> bool:
    live_equal = all(actual[kind] == expected[kind] for kind in ("companies", "users"))
    return live_equal and set(actual["deleted"]) <= set(expected["deleted"])


@pytest.fixture
def replica(container: Container) -> Iterator[Container]:
    yield container


def _reset(container: Container) -> None:
    with container.connections.database.connection() as conn:
        for table in (
            "outbox_events",
            "talent_import_failed_items",
            "talent_deletions",
            "role_assignments",
            "users",
        ):
            conn.execute(psycopg.sql.SQL("DELETE FROM identity.{}").format(psycopg.sql.Identifier(table)))
        conn.execute("DELETE FROM identity.companies")


@settings(
    max_examples=100,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(deliveries=_deliveries())
def test_any_delivery_converges_on_the_newest_versions(
    replica: Container, deliveries: tuple[list[dict[str, Any]], list[list[dict[str, Any]]]]
) -> None:
    snapshots, batches = deliveries
    _reset(replica)
    outcomes = [outcome for batch in batches for outcome in _consume(replica, batch)]
    for _ in range(3):
        outcomes += _retry_deferred(replica)

    actual, expected = _actual(replica), _expected(snapshots)
    assert _converged(actual, expected), (actual, expected)
    applied = [o for batch in outcomes for o in batch.outcomes if o.result is ItemResult.APPLIED]
    upserts = [
        e for e in talent.outbox_events(replica) if e["eventType"] in ("CompanyUpserted", "UserUpserted")
    ]
    assert len(upserts) == len(applied)  # a skipped or failed item wrote no event
