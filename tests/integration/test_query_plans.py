"""The fan-out's page statements reach users and assignments through indexes, on any server; the relay's
statements touch a batch's rows whatever the outbox's statistics say.

The plans are taken with the planner's default costs (random_page_cost = 4, as on a server nobody tuned; the
embedded server runs with 1.1), as custom plans for real pages and as the generic plan a prepared statement
falls back to. No node may scan `users` or `role_assignments` whole, nor any table bigger than a few pages:
a page costs what its 500 users cost, not what the tables hold.
"""

from __future__ import annotations

import json
import random
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from pin_identity.adapters.postgres.catalogue import query
from pin_identity.adapters.postgres.outbox_writer import template_params, write_outbox
from pin_identity.config import FanOutSettings
from pin_identity.domain.events import ACCESS_TOPIC, access_changed_template
from pin_identity.domain.model import AccessChangeReason
from tests.support.relay import access_message
from tests.support.seed import BulkAssignment, bulk_company, copy_assignments, copy_users

PAGE_STATEMENTS = ("lock_fanout_page", "rendered_access_snapshots", "write_access_changes")
ALWAYS_INDEXED = frozenset({"users", "role_assignments"})
SMALL_TABLE_PAGES = 8  # a table this small may be read whole: one or two reads, whatever the plan
NIL_UUID = uuid.UUID(int=0)
PAGE = FanOutSettings().batch_size

Plan = dict[str, Any]
ENVELOPE = template_params(
    access_changed_template(
        reason=AccessChangeReason.ROLE_PERMISSIONS_CHANGED,
        version=1,
        changed_role_id=NIL_UUID,
        correlation_id=NIL_UUID,
        occurred_at=datetime(2026, 11, 30, tzinfo=UTC),
    )
)


@dataclass(frozen=True)
class SeededRole:
    url: str
    role_id: uuid.UUID


@pytest.fixture
def seeded_role(database_url: str) -> SeededRole:
    """5,000 users in random id order: 3,500 hold the role (a third of them in two scopes), 1,500 only
    another role; revoked, expired and expiring rows mixed in; then ANALYZE, as autovacuum would."""
    role_id = _seed(database_url, holders=3_500, others=1_500, rng=random.Random(13))
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("ANALYZE")
    return SeededRole(database_url, role_id)


@pytest.mark.parametrize("statement", PAGE_STATEMENTS)
def test_a_fanout_page_never_scans_a_whole_table_under_default_costs(
    statement: str, seeded_role: SeededRole
) -> None:
    with psycopg.connect(seeded_role.url) as conn:
        conn.execute("SET random_page_cost = 4")
        large = _large_tables(conn)
        assert large >= ALWAYS_INDEXED, "the seed must make the tables too big to read whole per page"
        for kind, plan in _plans(conn, statement, seeded_role.role_id):
            scans = sorted(_whole_table_scans(plan, large))
            assert not scans, f"{statement} ({kind} plan) scans {scans} whole:\n{json.dumps(plan, indent=1)}"


def test_the_fanouts_pace_counts_what_waits_up_to_its_limit_through_the_index(database_url: str) -> None:
    """Before each page the fan-out asks how many events wait in the outbox, up to its limit: the first ids
    of the index, counted; rows long gone between them (removed out of order) and one row kept long at the
    head do not count as waiting."""
    key = uuid.uuid4()
    with psycopg.connect(database_url) as conn:
        write_outbox(conn, [access_message(key, {"n": n}) for n in range(6_000)])
        conn.commit()
        conn.execute("DELETE FROM identity.outbox_events WHERE id % 3 = 0")  # the relay removes out of order
        conn.execute("SELECT setval('identity.outbox_events_id_seq', 1000000)")  # ids far apart
        write_outbox(conn, [access_message(key, {"n": 6_000})])
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE identity.outbox_events")
    with psycopg.connect(database_url) as conn:
        conn.execute("SET random_page_cost = 4")
        assert "outbox_events" in _large_tables(conn)
        plan = _explain(conn, f"EXPLAIN (FORMAT JSON) {query('outbox_waiting_estimate')}", {"cap": 10_001})
        assert not list(_whole_table_scans(plan, _large_tables(conn))), json.dumps(plan, indent=1)
        counted = [
            conn.execute(query("outbox_waiting_estimate"), {"cap": cap}).fetchone() for cap in (10_001, 1_000)
        ]
    assert counted == [(4_001,), (1_000,)]


def _plans(conn: psycopg.Connection, statement: str, role_id: uuid.UUID) -> Iterator[tuple[str, Plan]]:
    """The generic plan, then custom plans for the first page and for one in the middle of the role."""
    yield "generic", _explain(conn, f"EXPLAIN (GENERIC_PLAN, FORMAT JSON) {_positional(query(statement))}")
    _, after_first = _page(conn, role_id, NIL_UUID)
    for label, cursor in (("first page", NIL_UUID), ("middle page", after_first)):
        params: dict[str, Any] = {"role_id": role_id, "cursor": cursor, "limit": PAGE}
        if statement != "lock_fanout_page":
            params = {"user_ids": _page(conn, role_id, cursor)[0], **ENVELOPE}
        yield label, _explain(conn, f"EXPLAIN (FORMAT JSON) {query(statement)}", params)


def _explain(conn: psycopg.Connection, sql: str, params: dict[str, Any] | None = None) -> Plan:
    row = conn.execute(sql, params).fetchone()
    conn.rollback()
    assert row is not None
    plan: Plan = row[0][0]["Plan"]
    return plan


def _page(conn: psycopg.Connection, role_id: uuid.UUID, cursor: uuid.UUID) -> tuple[str, uuid.UUID]:
    """The page's ids (the text of a uuid[], as lock_fanout_page hands them on) and its last id."""
    params = {"role_id": role_id, "cursor": cursor, "limit": PAGE}
    row = conn.execute(query("lock_fanout_page"), params).fetchone()
    conn.rollback()
    assert row is not None
    size, last, ids = row
    assert size == PAGE
    return ids, last


def _positional(sql: str) -> str:
    """%(name)s placeholders as $1, $2, ... in order of first use: the form EXPLAIN (GENERIC_PLAN) takes."""
    names: list[str] = []
    for name in re.findall(r"%\((\w+)\)s", sql):
        if name not in names:
            names.append(name)
    for number, name in enumerate(names, start=1):
        sql = sql.replace(f"%({name})s", f"${number}")
    return sql


def _large_tables(conn: psycopg.Connection) -> frozenset[str]:
    rows = conn.execute(
        "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = 'identity' AND c.relkind = 'r' AND c.relpages > %s",
        (SMALL_TABLE_PAGES,),
    ).fetchall()
    return frozenset(row[0] for row in rows)


def _whole_table_scans(plan: Plan, large: frozenset[str]) -> Iterator[str]:
    if plan["Node Type"] == "Seq Scan" and plan["Relation Name"] in large:
        yield plan["Relation Name"]
    for child in plan.get("Plans", []):
        yield from _whole_table_scans(child, large)


def _seed(url: str, *, holders: int, others: int, rng: random.Random) -> uuid.UUID:
    users = [uuid.uuid4() for _ in range(holders + others)]  # random ids, written in this (random) order
    with psycopg.connect(url) as conn, conn.cursor() as cur:
        company_id, (role_id, other_role) = bulk_company(cur, "Plans", ("sales-manager", "chessboard-viewer"))
        copy_users(cur, company_id, users)
        held = {
            user_id: _assignments(role_id if number < holders else other_role, other_role, rng)
            for number, user_id in enumerate(users)
        }
        copy_assignments(cur, company_id, held)
    return role_id


def _assignments(role_id: uuid.UUID, other_role: uuid.UUID, rng: random.Random) -> list[BulkAssignment]:
    """One user's rows: two or so."""
    soon = datetime.now(UTC) + timedelta(days=30)
    rows = [BulkAssignment(role_id)]
    if rng.random() < 1 / 3:
        expires = soon if rng.random() < 0.3 else None
        rows.append(BulkAssignment(role_id, "Project", expires_at=expires, project_id=uuid.uuid4()))
    if rng.random() < 0.5 and role_id != other_role:
        rows.append(BulkAssignment(other_role))
    if rng.random() < 0.4:
        status = rng.choice(("Revoked", "Expired"))
        rows.append(BulkAssignment(role_id, "Project", status, project_id=uuid.uuid4()))
    return rows


# The relay's reads and removals, with the parameters its session sends (its session plans each with them).
_RELAY_LIMIT = 2_000
_RELAY_READ = {"after": 0, "upto": None, "topic": None, "skip": [], "limit": _RELAY_LIMIT, "max_bytes": 2**24}


def test_the_relays_statements_touch_no_more_rows_than_a_batch_when_the_statistics_say_the_outbox_is_empty(
    database_url: str,
) -> None:
    """The outbox empties whenever the relay catches up, and a vacuum then records it as holding no rows
    (its pages kept: a table in use is not truncated). Until the next analyze, the planner takes the outbox
    for a one-row table, whatever arrives meanwhile (a million-user fan-out). Every statement the relay
    runs on it still touches at most a batch's rows; a plan that scanned the page once per row of the table
    took 33 s for a read of 2,000 rows of 25,000, past the relay session's 15 s limit, so that no read ever
    finished and nothing was published."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        write_outbox(conn, [access_message(uuid.uuid4(), {"n": n}) for n in range(300)])
        conn.execute("DELETE FROM identity.outbox_events")  # published
        conn.execute("VACUUM (ANALYZE, TRUNCATE false) identity.outbox_events")
        write_outbox(conn, [access_message(uuid.uuid4(), {"n": n}) for n in range(25_000)])
        stats = conn.execute(
            "SELECT reltuples, relpages FROM pg_class WHERE oid = 'identity.outbox_events'::regclass"
        ).fetchone()
        assert stats is not None and stats[0] == 0 and stats[1] > 0, f"statistics of an empty outbox: {stats}"
        ids, event_ids = zip(
            *conn.execute(
                "SELECT id, event_id FROM identity.outbox_events ORDER BY id LIMIT %s", (_RELAY_LIMIT,)
            ).fetchall(),
            strict=True,
        )
        last = conn.execute("SELECT max(id) FROM identity.outbox_events").fetchone()
    read = {**_RELAY_READ, "final": last[0]}
    held = {**_RELAY_READ, "skip": None, "topic": ACCESS_TOPIC, "upto": last[0], "final": last[0]}
    removal = {"ids": list(ids), "event_ids": list(event_ids)}
    statements = [
        ("the read", "fetch_ready_outbox_events", read, _RELAY_LIMIT),
        ("a held topic's read", "fetch_ready_outbox_events", held, _RELAY_LIMIT),
        ("the removal", "delete_outbox_events", removal, _RELAY_LIMIT),
        ("the backlog", "outbox_backlog", {}, 10_000),  # the first 10,000 rows counted (its comment)
        ("the fan-out's pace", "outbox_waiting_estimate", {"cap": 10_001}, 10_001),
    ]
    with psycopg.connect(database_url) as conn:
        conn.execute("SET plan_cache_mode = force_custom_plan")
        for label, statement, params, rows in statements:
            _assert_touches_at_most(conn, statement, params, rows, label)


def _assert_touches_at_most(
    conn: psycopg.Connection, statement: str, params: dict[str, Any], rows: int, label: str
) -> None:
    """Every node of the statement's plan, run, handles at most `rows` rows over all its loops (those it
    returns and those its filters drop)."""
    plan = _explain(conn, f"EXPLAIN (ANALYZE, FORMAT JSON) {query(statement)}", params)
    touched = {node: count for node, count in _rows_handled(plan) if count > rows}
    assert not touched, f"{label} ({statement}) handles {touched} rows:\n{json.dumps(plan, indent=1)}"


def _rows_handled(plan: Plan, path: str = "") -> Iterator[tuple[str, float]]:
    name = f"{path}/{plan['Node Type']}" + (f" on {plan['Relation Name']}" if "Relation Name" in plan else "")
    dropped = plan.get("Rows Removed by Filter", 0) + plan.get("Rows Removed by Join Filter", 0)
    yield name, (plan["Actual Rows"] + dropped) * plan["Actual Loops"]
    for child in plan.get("Plans", []):
        yield from _rows_handled(child, name)
