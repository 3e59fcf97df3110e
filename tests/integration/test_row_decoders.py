"""The hot reads that take their rows by position (a row object per row would cost their loops): each
statement's columns, as the server names them, stand in the order its decoder reads them. Every other read
takes its columns by name (psycopg.rows), where a renamed column fails loudly instead of shifting a field."""

from __future__ import annotations

import re
from dataclasses import fields

import psycopg
import pytest

from pin_identity.adapters.postgres.catalogue import query
from pin_identity.domain.events import CompanyState, UserState
from pin_identity.domain.model import RenderedAccessSnapshot
from pin_identity.operations.ports.outbox import PendingEvent

COMPANY = tuple(field.name for field in fields(CompanyState))
USER = tuple(field.name for field in fields(UserState))

POSITIONAL_READS: dict[str, tuple[str, ...]] = {
    # outbox_queue._pending_events: each row's first columns become a PendingEvent; the queue removes the row
    # by its outbox id and the event id after them.
    "fetch_ready_outbox_events": (*PendingEvent._fields, "event_id", "page_rows"),
    # fanout_queue._locked_page
    "lock_fanout_page": ("page_size", "last_user_id", "user_ids"),
    # replica_store._companies_by_tenant, _users_by_talent_id, _access_changes, phone_owners, deleted_versions
    "companies_by_tenant": COMPANY,
    "share_companies_by_tenant": COMPANY,
    "users_by_talent_id": USER,
    "lock_users_by_talent_id": USER,
    "phone_owners": ("phone", "id"),
    "talent_deleted_versions": ("external_id", "version"),
    "user_access_versions": ("user_id", "version"),
    # Also access_truth's truths and user_state. The rendered activeAssignments column is named after its
    # outermost function: the block belongs to the event's renderings (domain/events.py names them).
    "rendered_access_snapshots": (*RenderedAccessSnapshot._fields[:2], "coalesce"),
    # access_truth's last_events
    "audit_last_events": ("user_id", "fingerprint"),
}


def test_the_page_decoders_find_the_talent_ids_where_the_records_keep_them() -> None:
    assert COMPANY[6] == "external_talent_tenant_id"  # replica_store._companies_by_tenant keys by row[6]
    assert USER[11] == "external_talent_user_id"  # replica_store._users_by_talent_id keys by row[11]


@pytest.mark.parametrize("statement", sorted(POSITIONAL_READS))
def test_a_positional_read_has_its_columns_in_its_decoders_order(statement: str, database_url: str) -> None:
    assert _columns(database_url, statement) == POSITIONAL_READS[statement]


def _columns(database_url: str, statement: str) -> tuple[str, ...]:
    """The statement's result columns, run with every parameter null (it matches nothing) and rolled back."""
    params = dict.fromkeys(re.findall(r"%\((\w+)\)s", query(statement)))
    with psycopg.connect(database_url) as conn:
        conn.execute(query("create_audit_topic_records"))  # audit_last_events reads the audit's own table
        cursor = conn.execute(query(statement), params)
        assert cursor.description is not None
        names = tuple(column.name for column in cursor.description)
        conn.rollback()
    return names
