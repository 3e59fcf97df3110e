"""The relay's side of the outbox: one dedicated session that holds the relay lock and moves rows out."""

from __future__ import annotations

import os
import socket
from collections.abc import Collection, Iterable, Mapping, Sequence
from contextlib import ExitStack, suppress
from functools import partial
from operator import itemgetter
from typing import Any, cast

import psycopg
from psycopg.rows import RowFactory, dict_row, scalar_row

from pin_identity.adapters.postgres.catalogue import query
from pin_identity.adapters.postgres.database import Database, Row, SilenceLimit, WaitWatch, read
from pin_identity.domain.errors import OutboxIdsWentBackError
from pin_identity.operations.ports.outbox import (
    Fetched,
    OutboxBacklog,
    PendingEvent,
    PublishingHolder,
    RelayRole,
)


class IdHorizon:
    """The outbox id up to which every row is final: committed and visible to every later statement, or
    rolled back. The relay reads rows only up to it, so it never steps over a row that commits late, and
    never has to look below the last row it read.

    Why it holds. A transaction that takes an outbox id (the identity sequence's nextval) holds the
    sequence's lock in ROW EXCLUSIVE mode from before it takes the id until it ends (PostgreSQL's
    sequence.c, lock_and_open_sequence); a read of the sequence's row takes ACCESS SHARE and no id. So:
    1. a statement A reads the sequence's last value V: every id <= V was taken before A;
    2. a later statement B lists the transactions holding the sequence's lock in ROW EXCLUSIVE mode (its
       writers): a transaction that took an id <= V has either ended before B or is one of them;
    3. once a statement C after B finds none of B's writers holding the lock any more, all of them have ended.
       A commit is visible to new snapshots before the transaction's locks go, so every statement after C
       sees every row with an id <= V that will ever exist, and no such row can appear later.
    Statements of one session run one after another, so "later" is the order of `observe` calls, and a
    fetch bounded by `final` runs after the call that set it. A writer is known by its virtual transaction
    id, which a transaction keeps until it ends unless it is prepared (two-phase commit): while any prepared
    transaction exists, a reading moves nothing. A sequence cache above 1 would break step 1 (a session
    hands out its cached ids after the read), so the queue refuses one.
    """

    def __init__(self) -> None:
        self.final = 0
        self._last_read: int | None = None  # the sequence's last value, as the previous observation read it
        self._waiting_for: tuple[int, frozenset[str]] | None = None  # an id, and writers that may hold one

    def observe(self, last_value: int, writers: Collection[str], *, prepared: bool = False) -> None:
        """One reading (step 1 for the next call; steps 2 and 3 for earlier ones)."""
        if last_value < max(self._last_read or 0, self.final):
            # Ids are handed out again below what is read (a restarted sequence): rows written from now on
            # would lie below the reader's position, never read. Raised at every reading until a new horizon.
            raise OutboxIdsWentBackError(max(self._last_read or 0, self.final), last_value)
        if prepared:
            return  # a writer may have changed its name: wait until no prepared transaction is left
        now_writing = frozenset(writers)
        if self._waiting_for is not None and not self._waiting_for[1] & now_writing:
            self.final = max(self.final, self._waiting_for[0])
            self._waiting_for = None
        if self._waiting_for is None and self._last_read is not None:
            if now_writing:
                self._waiting_for = (self._last_read, now_writing)
            else:
                self.final = max(self.final, self._last_read)
        self._last_read = last_value


# A row as the queue removes it: its outbox id and its event id (delete_outbox_events says why both).
_RowIdentity = tuple[int, str]
# fetch_ready_outbox_events's columns: PendingEvent's fields in order, then the event id, then the page's rows
# (held to it by tests/integration/test_row_decoders.py). Taken apart by itemgetter: no Python frame for each
# row.
_EVENT_ID = len(PendingEvent._fields)
_PAGE_ROWS = _EVENT_ID + 1
_event_fields = itemgetter(slice(_EVENT_ID))
_row_identity = itemgetter(0, _EVENT_ID)
_outbox_id = itemgetter(0)


def _pending_events(rows: list[tuple[Any, ...]]) -> list[PendingEvent]:
    """The rows of fetch_ready_outbox_events by position, as tuple.__new__ makes them (what
    PendingEvent._make calls, without a Python frame for each of the batch's rows)."""
    events = map(partial(tuple.__new__, PendingEvent), map(_event_fields, rows))
    return cast("list[PendingEvent]", list(events))


def _array(values: Iterable[object]) -> str:
    """Values as the text of a PostgreSQL array: psycopg's array dumper is a Python loop over the elements."""
    return "{" + ",".join(map(str, values)) + "}"


class PostgresOutboxQueue:
    """The advisory lock lives with the session: when the session dies, a standby relay takes over. With a
    SilenceLimit (the relay's), a session whose path to the server goes silent dies within that limit too,
    where TCP alone would keep it (and the lock) for hours; `stalled()` says when this relay has waited on
    the server longer than that.

    `identity.outbox_relay_handover` says whether the last active relay stood down cleanly (its producer
    discarded before the lock went): a relay taking the lock from one that did not is TAKEN_OVER, which the
    relay logs. It starts at once all the same: its producer fences the old one's at the broker.

    The session runs in pipeline mode. The rows acknowledged since the last read are removed by one
    statement sent right after the next read, not waited for: the server deletes while the relay hands
    the batch to the producer (fewer, larger deletes, and no round trip of their own). Every statement
    that answers something sends the pending removals first and is followed by a sync, which commits what
    was sent before it and raises its errors. A removal is forgotten only once a sync committed it.

    A row is removed (or moved to the dead letters) by its id and its event id, as it was read: after a crash
    that lost the WAL tail, an id the relay acknowledged may since have been handed out again.
    """

    def __init__(self, database: Database, silence: SilenceLimit | None = None):
        self._database = database
        self._silence = silence
        self._waits = WaitWatch()
        self._conn: psycopg.Connection | None = None
        self._pipeline_mode = ExitStack()
        self._pipeline: psycopg.Pipeline | None = None
        self._active = False
        self._horizon = IdHorizon()
        # Every row up to this id was read as of the last fetch that came back short of its limit: what is
        # known final above a reader's position may all be read already (or long deleted), so a look at the
        # horizon is due even when `final` stands far above that position.
        self._read_to_final = 0
        # The event id of each row read and not yet settled, by outbox id.
        self._read: dict[int, str] = {}
        # Removed with the next statement sent; kept across a new session (they were acknowledged).
        self._acknowledged: list[_RowIdentity] = []
        # Sent for removal but not yet synced. Should the session die first, they are removed again in the
        # next one: a row whose removal was lost while its key's later row was removed would otherwise be
        # read again and published behind it.
        self._removing: list[_RowIdentity] = []
        self._holder = f"{socket.gethostname()}:{os.getpid()}:{id(self):x}"

    def _session(self) -> psycopg.Connection:
        if self._conn is None or self._conn.closed:
            conn = self._database.dedicated(
                autocommit=True, name="pin-identity-outbox-relay", silence=self._silence
            )
            # Removing published rows need not wait for the WAL flush: a removal lost in a crash only
            # sends those events once more, which at-least-once delivery allows. (And custom plans: see the
            # statement's comment.) Two statements in one: before pipeline mode, which allows one.
            with self._waits.waiting():
                conn.execute(query("relay_session_settings"))
            self._pipeline_mode = ExitStack()
            self._pipeline = self._pipeline_mode.enter_context(conn.pipeline())
            self._conn = conn
            self._active = False
            self._horizon = IdHorizon()
            self._read_to_final = 0
            self._observe_horizon()
        return self._conn

    def _ask(
        self, name: str, row_factory: RowFactory[Row], params: Mapping[str, Any] | None = None
    ) -> Row | None:
        """The row of a named statement that answers with one, after a sync (one round trip)."""
        self._send_removals()
        cursor = read(self._session(), name, params, row_factory)
        self._sync()
        return cursor.fetchone()

    def _sync(self) -> None:
        if self._pipeline is not None:
            try:
                with self._waits.waiting():
                    self._pipeline.sync()
            except BaseException:
                self._take_back_removals()
                raise
            self._removing = []

    def _take_back_removals(self) -> None:
        """Removals not known to be committed are sent again (removing a row twice is harmless)."""
        self._acknowledged[:0] = self._removing
        self._removing = []

    def stalled(self) -> bool:
        """Whether the session has now waited on the server for longer than its SilenceLimit (a path that
        went silent where the client's TCP sees nothing wrong); never without one. Safe from any thread."""
        return self._silence is not None and self._waits.waited_s() > self._silence.after_s

    def try_become_active(self) -> RelayRole:
        self._session()
        if self._active:
            return RelayRole.ACTIVE
        if not self._ask("try_lock_outbox_relay", scalar_row):
            return RelayRole.STANDBY
        self._active = True
        clean = self._ask("take_outbox_relay_handover", scalar_row, {"holder": self._holder})
        return RelayRole.ACTIVE if clean else RelayRole.TAKEN_OVER

    def fetch_ready(
        self, limit: int, after: int, *, max_bytes: int, skip_topics: Collection[str] = ()
    ) -> Fetched:
        self._session()
        # What is known final and not read yet may not fill the batch: look again.
        if self._horizon.final - max(after, self._read_to_final) < limit:
            self._observe_horizon()
        final = self._horizon.final
        if final <= after:
            return Fetched([], after)
        params = {
            "after": after, "upto": None, "final": final, "topic": None, "skip": list(skip_topics),
            "limit": limit, "max_bytes": max_bytes,
        }  # fmt: skip
        fetched = self._fetch(params, after, final)
        if fetched.upto == final and not skip_topics:
            self._read_to_final = final
        return fetched

    def fetch_topic(self, topic: str, limit: int, after: int, upto: int, *, max_bytes: int) -> Fetched:
        self._session()
        end = min(upto, self._horizon.final)
        if end <= after:
            return Fetched([], after)
        params = {
            "after": after, "upto": end, "final": self._horizon.final, "topic": topic, "skip": None,
            "limit": limit, "max_bytes": max_bytes,
        }  # fmt: skip
        return self._fetch(params, after, end)

    def _fetch(self, params: Mapping[str, Any], after: int, end: int) -> Fetched:
        """Rows of fetch_ready_outbox_events; how far they read: `end` when the page held every row up to it
        (short of its limit, nothing cut for size), else its last row."""
        conn = self._session()
        if self._acknowledged and max(map(_outbox_id, self._acknowledged)) > after:
            # After a rewind (`after` back at 0) the read would find rows already delivered, and publish them
            # again behind their key's newer ones: their removal goes first, in the same round trip.
            self._send_removals()
        # Binary transfer: the batch is megabytes of event values, and text parsing is the slow part.
        with conn.cursor(binary=True) as cursor:
            cursor.execute(query("fetch_ready_outbox_events"), params)
            self._sync()
            # Not waited for: the server removes these rows while the relay hands the batch to the producer.
            # The next statement's sync commits the removal (and raises its error).
            self._send_removals()
            rows = cursor.fetchall()
        self._read.update(map(_row_identity, rows))
        complete = not rows or (rows[0][_PAGE_ROWS] == len(rows) < params["limit"])
        return Fetched(_pending_events(rows), end if complete else rows[-1][0])

    def _observe_horizon(self) -> None:
        sequence = self._ask("outbox_id_horizon", dict_row)
        assert sequence is not None  # the statement answers with one row
        if sequence["cache"] != 1:
            raise RuntimeError(
                f"the outbox id sequence caches {sequence['cache']} ids; the relay needs a cache of 1"
            )
        self._horizon.observe(
            int(sequence["last_value"]), sequence["writers"], prepared=bool(sequence["prepared"])
        )

    def settle(self, delivered: Sequence[int], rejected: Mapping[int, str]) -> None:
        """Acknowledged rows are removed with the next read (fewer, larger deletes, none waited for on its
        own); rejected ones move to the dead letters at once, committed before the caller lets the key's next
        row go (a move lost with the session would put the rejected row back in front of it)."""
        self._acknowledged.extend(self._as_read(delivered))
        if rejected:
            conn = self._session()
            for (outbox_id, event_id), error in zip(self._as_read(rejected), rejected.values(), strict=True):
                params = {"id": outbox_id, "event_id": event_id, "error": error[:2000]}
                conn.execute(query("dead_letter_outbox_event"), params)
            self._sync()

    def _as_read(self, outbox_ids: Iterable[int]) -> list[_RowIdentity]:
        """The rows of these ids as this queue read them (and no longer waiting to be settled)."""
        ids = list(outbox_ids)
        return list(zip(ids, map(self._read.pop, ids), strict=True))

    def _send_removals(self) -> None:
        conn = self._session()  # first: a session opened here sends what is pending itself
        if self._acknowledged:
            rows, self._acknowledged = self._acknowledged, []
            self._removing.extend(rows)
            ids, event_ids = zip(*rows, strict=True)
            conn.execute(query("delete_outbox_events"), {"ids": _array(ids), "event_ids": _array(event_ids)})

    def transactional_id(self) -> str:
        """The outbox's Kafka transactional.id, the same for every relay of it."""
        [transactional_id] = self._database.fetch("outbox_transactional_id", {}, scalar_row)
        return str(transactional_id)

    def backlog(self) -> OutboxBacklog:
        backlog = self._ask("outbox_backlog", dict_row)
        assert backlog is not None  # the statement answers with one row
        running_s = backlog["running_s"]
        holder = (
            PublishingHolder(backlog["pid"], backlog["application_name"], running_s, backlog["gid"])
            if backlog["writing"]
            else None
        )
        return OutboxBacklog(
            int(backlog["waiting"]), float(backlog["oldest_age_s"]), float(running_s or 0.0), holder
        )

    def is_drained(self) -> bool:
        return bool(self._ask("outbox_is_empty", scalar_row))

    def heartbeat(self) -> None:
        self._ask("ping", scalar_row)

    def still_active(self) -> bool:
        if not self._active or self._conn is None or self._conn.closed:
            return False  # a session opened again would not hold the lock
        try:
            self.heartbeat()
        except psycopg.Error:
            return False
        return True

    def stand_down(self) -> None:
        if self._conn is None:
            return
        try:
            if self._active and not self._conn.closed:
                self._send_removals()
                self._conn.execute(query("stand_down_outbox_relay"), {"holder": self._holder})
                self._sync()
        except psycopg.Error:
            pass  # the session is gone, and the lock with it: the next relay is TAKEN_OVER (and logs it)
        finally:
            self._read = {}  # nothing handed out before can be settled any more (OutboxQueue.stand_down)
            self.reset()

    def reset(self) -> None:
        """Close the session (after syncing what was sent, when it still can)."""
        if self._conn is not None:
            try:
                with suppress(psycopg.Error):  # a session already gone has nothing to sync
                    self._pipeline_mode.close()
                self._conn.close()
            finally:
                self._take_back_removals()
                self._conn = None
                self._pipeline = None
                self._active = False
