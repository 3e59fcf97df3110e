"""The database's side of the access audit on PostgreSQL: the truths and the topic's last events stream whole,
in user order, whatever the chunks they are read in, and the two streams read in turns (as the audit's merge
reads them) inside one snapshot."""

from __future__ import annotations

from uuid import UUID

import psycopg

from pin_identity.adapters.postgres.access_truth import AuditChunks, PostgresAccessTruth
from pin_identity.composition.connections import Connections
from pin_identity.composition.stores import Stores
from pin_identity.domain.access_verdicts import LastEvent, compare
from tests.support import seed

HOLDERS = 7
SMALL = AuditChunks(truths=2, last_events=3)  # every read crosses chunk edges


def _holders(database_url: str) -> list[bytes]:
    with psycopg.connect(database_url) as conn:
        rows = conn.execute("SELECT DISTINCT user_id FROM identity.role_assignments ORDER BY user_id")
        return [user_id.bytes for (user_id,) in rows]


def _published(database_url: str) -> None:
    """The seed's access events taken as published: none of its users is pending."""
    with psycopg.connect(database_url) as conn:
        conn.execute("DELETE FROM identity.outbox_events")


def _truths(truth: PostgresAccessTruth) -> list[tuple[bytes, int]]:
    with truth.session() as session, session.snapshot() as snapshot:
        return list(snapshot.truths())


def test_truths_read_in_small_chunks_are_those_read_in_one(
    connections: Connections, stores: Stores, database_url: str
) -> None:
    seed.held_role(stores.identity_transactions, HOLDERS)
    whole = _truths(PostgresAccessTruth(connections.database))
    assert [user for user, _ in whole] == _holders(database_url)
    assert _truths(PostgresAccessTruth(connections.database, SMALL)) == whole


def test_each_users_last_record_wins_across_chunks_and_the_merge_reads_both_in_turns(
    connections: Connections, stores: Stores, database_url: str
) -> None:
    seed.held_role(stores.identity_transactions, HOLDERS)
    _published(database_url)
    truths = dict(_truths(PostgresAccessTruth(connections.database)))
    users = list(truths)
    stranger = UUID(int=2**128 - 1).bytes  # after every user: only on the topic
    older: list[LastEvent] = [(user, -5) for user in users]  # each user's earlier, wrong record
    latest: list[LastEvent] = [(user, truths[user]) for user in reversed(users)]
    with PostgresAccessTruth(connections.database, SMALL).session() as session:
        session.keep(older[:4])
        session.keep([*older[4:], (stranger, None), *latest])
        with session.snapshot() as snapshot:
            last_events = list(snapshot.last_events())
        with session.snapshot() as snapshot:
            report = compare(snapshot.last_events(), snapshot.truths(), snapshot.pending())
    assert last_events == sorted([*latest, (stranger, None)])
    assert report.users == report.matching == HOLDERS
    assert (report.drifted, report.missing, report.pending) == (0, 0, 0)
