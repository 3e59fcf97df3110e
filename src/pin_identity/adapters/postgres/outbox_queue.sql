-- The outbox relay's session (outbox_queue.py): its lock and handover, the id horizon, its reads and
-- removals, the backlog. Parameters use psycopg's %(name)s style.

-- name: relay_session_settings
-- A custom plan per statement: under a generic plan an id array (once the 20,000 ids in flight, now the ids
-- removed at once) was searched row by row, and a fetch with 18,000 in flight held up the relay's loop (and
-- its session checks; BENCHMARKS.md has the figures). Planning the relay's few statements each time costs
-- little. fetch_ready_outbox_events counts on it too: a condition it is given null for drops out of a custom
-- plan only.
SET synchronous_commit = off; SET plan_cache_mode = force_custom_plan;

-- name: try_lock_outbox_relay
SELECT pg_try_advisory_lock(hashtextextended('pin-identity:lock:outbox-relay', 0));

-- name: take_outbox_relay_handover
-- Run by the relay that just took the lock: whether the one before it stood down cleanly.
-- (Only the lock's holder writes the row, so reading the old value in the same statement is safe.)
UPDATE identity.outbox_relay_handover h
SET holder = %(holder)s, clean = false, updated_at = now()
FROM (SELECT clean FROM identity.outbox_relay_handover WHERE id = 1) AS before
WHERE h.id = 1
RETURNING before.clean;

-- name: outbox_transactional_id
-- The one Kafka transactional.id of this outbox (migration 0006): every relay of it uses it, so the one that
-- takes over fences the producers of the ones before it.
SELECT transactional_id FROM identity.outbox_relay_handover WHERE id = 1;

-- name: stand_down_outbox_relay
UPDATE identity.outbox_relay_handover SET clean = true, updated_at = now()
WHERE id = 1 AND holder = %(holder)s;

-- name: outbox_id_horizon
-- The outbox's id sequence as it stands, and every transaction holding the sequence's lock as a writer (a
-- transaction that takes an id keeps it until it ends): IdHorizon in outbox_queue.py turns them into the id
-- up to which every row is final. A writer is known by its mode: nextval, setval and every restart lock the
-- sequence ROW EXCLUSIVE for the rest of the transaction (PostgreSQL's src/backend/commands/sequence.c,
-- lock_and_open_sequence, through init_sequence), while a read of the sequence's row (`SELECT last_value`, as
-- pg_dump 15-17 reads every sequence inside its one transaction) takes ACCESS SHARE, and takes no id.
-- The cache size must be 1: ids cached by a session would be handed out after this read.
-- A prepared transaction that holds the sequence's lock is said apart: preparing gives a transaction's locks
-- another virtual id, and no pid. Prepared transactions that took no outbox id (another application's) hold
-- nothing back.
WITH writing AS (
    SELECT l.virtualtransaction, l.pid IS NULL AS prepared
    FROM pg_locks l
    WHERE l.locktype = 'relation'
      AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
      AND l.relation = 'identity.outbox_events_id_seq'::regclass
      AND l.mode = 'RowExclusiveLock'
      AND l.pid IS DISTINCT FROM pg_backend_pid()
)
SELECT CASE WHEN s.is_called THEN s.last_value ELSE 0 END AS last_value,
       ARRAY(SELECT virtualtransaction FROM writing) AS writers,
       (SELECT seqcache FROM pg_sequence WHERE seqrelid = 'identity.outbox_events_id_seq'::regclass) AS cache,
       EXISTS (SELECT FROM writing WHERE prepared) AS prepared
FROM identity.outbox_events_id_seq s;

-- name: fetch_ready_outbox_events
-- The next rows after the last one the relay read, never past the id up to which every row is final, so a
-- row that commits late is never stepped over, and rows of one aggregate leave in the order their
-- transactions wrote them. The relay itself holds back the later rows of a key that has one in flight.
-- Rows of the topics it holds (`skip`: a topic the broker does not have) are left where they are; a topic it
-- held is read again on its own (`topic`, `skip` null) from where it was left up to `upto` (where the other
-- topics stand). One statement for both reads, each planned as it was as a statement of its own: the relay's
-- session plans every run with its values (relay_session_settings), so a condition whose parameter is null
-- drops out of the plan. (`upto` stays null for the main read: a bound more or less on the id, even one
-- equal to `final`, weighs in the plan's costs; one fewer moved a held topic's read to another plan.)
-- At most `max_bytes` of values (the first row whatever its size): one pass over the page in id order, its
-- running size summed; a value stored out of line is read only for a row that fits (the page carries its
-- pointer). PendingEvent's fields in order, then the event id the row is removed by (delete_outbox_events),
-- then how many rows the page had before the cut (the relay's read position).
-- One scan, no join: the outbox empties whenever the relay catches up, a vacuum then records it as holding
-- no rows, and until the next analyze the planner takes it for a one-row table. A page joined back to the
-- table was then planned as a nested loop over the whole table, the page scanned once per row: 33 s for
-- 2,000 rows of 25,000, past the session's limit (tests/integration/test_query_plans.py).
SELECT id AS outbox_id, topic, message_key AS key, convert_to(value, 'UTF8') AS value, event_type,
       correlation_id::text AS correlation_id, traceparent, event_id::text AS event_id, page_rows
FROM (
    SELECT page.*, sum(size) OVER (ORDER BY id) AS running, count(*) OVER () AS page_rows
    FROM (
        SELECT id, topic, message_key, value, event_type, correlation_id, traceparent, event_id,
               octet_length(value) AS size
        FROM identity.outbox_events
        WHERE id > %(after)s AND (%(upto)s::bigint IS NULL OR id <= %(upto)s) AND id <= %(final)s
          AND (%(topic)s::text IS NULL OR topic = %(topic)s)
          AND (%(skip)s::text[] IS NULL OR topic <> ALL(%(skip)s::text[]))
        ORDER BY id
        LIMIT %(limit)s
    ) AS page
) AS sized
WHERE running - size < %(max_bytes)s
ORDER BY id;

-- name: delete_outbox_events
-- Acknowledged rows: by id, and only a row whose event id is among the acknowledged ones. An id alone may
-- name a row written since: the relay's session and fan-out pages commit without waiting for the WAL flush,
-- so a crash that loses the WAL tail can take back the id sequence's advance, and hand the ids of rows the
-- relay acknowledged (and still holds for removal) out again, to rows never published, whose event ids are
-- their own. Two arrays rather than (id, event id) pairs: the ids drive one index scan, and the event ids
-- are a hashed filter, about the cost of the ids alone; pairs joined through unnest probed the index once a
-- row, three to nine times slower (20,000 and 2,000 ids on a 500,000-row outbox).
DELETE FROM identity.outbox_events
WHERE id = ANY(%(ids)s::bigint[]) AND event_id = ANY(%(event_ids)s::uuid[]);

-- name: dead_letter_outbox_event
-- By id and event id, as delete_outbox_events removes.
WITH moved AS (DELETE FROM identity.outbox_events WHERE id = %(id)s AND event_id = %(event_id)s RETURNING *)
INSERT INTO identity.outbox_dead_letters (id, event_id, topic, message_key, event_type, correlation_id,
                                          traceparent, value, error, created_at)
SELECT id, event_id, topic, message_key, event_type, correlation_id, traceparent, value, %(error)s, created_at
FROM moved;

-- name: outbox_backlog
-- Rows waiting, and the age of the oldest, without counting a large outbox every few seconds (a million-row
-- fan-out): the first 10,000 rows in id order are counted; past that, the id range stands for the count (ids
-- are dense, so it overstates only by the rows already removed out of order and the ids of rolled-back
-- writes). The oldest row is among the first in id order; a row stuck there is what the age alert is for.
-- Then the oldest running transaction that took an outbox id (it holds the id sequence's lock as a writer
-- until it ends, see outbox_id_horizon): the relay publishes nothing after its id meanwhile. Its pid and
-- figures need the right to see other roles' sessions (pg_read_all_stats); without it they read null.
-- A prepared transaction that took an outbox id holds it the same way, with no session (pid null): it is
-- named by its gid (found through its transaction id's lock, of the same virtual id), its age since it was
-- prepared.
WITH head AS (SELECT id, created_at FROM identity.outbox_events ORDER BY id LIMIT 10000),
locks AS (
    SELECT l.pid, l.virtualtransaction FROM pg_locks l
    WHERE l.locktype = 'relation'
      AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
      AND l.relation = 'identity.outbox_events_id_seq'::regclass
      AND l.mode = 'RowExclusiveLock'
      AND l.pid IS DISTINCT FROM pg_backend_pid()
),
writer AS (
    SELECT * FROM (
        SELECT a.pid, a.application_name, NULL::text AS gid,
               EXTRACT(EPOCH FROM now() - a.xact_start)::float8 AS running_s
        FROM locks l JOIN pg_stat_activity a ON a.pid = l.pid
        UNION ALL
        SELECT NULL, NULL, p.gid, EXTRACT(EPOCH FROM now() - p.prepared)::float8
        FROM locks l
        JOIN pg_locks x ON x.locktype = 'transactionid' AND x.pid IS NULL
                       AND x.virtualtransaction = l.virtualtransaction
        JOIN pg_prepared_xacts p ON p.transaction = x.transactionid
        WHERE l.pid IS NULL
    ) AS writers
    ORDER BY running_s DESC NULLS LAST
    LIMIT 1
)
SELECT CASE WHEN count(*) < 10000 THEN count(*)
            ELSE (SELECT max(id) FROM identity.outbox_events) - min(head.id) + 1 END AS waiting,
       COALESCE(EXTRACT(EPOCH FROM now() - min(head.created_at)), 0)::float8 AS oldest_age_s,
       EXISTS (SELECT FROM writer) AS writing, (SELECT pid FROM writer) AS pid,
       (SELECT application_name FROM writer) AS application_name, (SELECT gid FROM writer) AS gid,
       (SELECT running_s FROM writer) AS running_s
FROM head;

-- name: outbox_is_empty
SELECT NOT EXISTS (SELECT 1 FROM identity.outbox_events);
