-- The database's side of the access audit and of `access show` (access_truth.py). Parameters use psycopg's
-- %(name)s style.

-- name: pending_access_users
-- The access audit: users whose access event is still in the outbox (a key is the user id).
SELECT DISTINCT message_key::uuid FROM identity.outbox_events
WHERE topic = %(topic)s AND message_key ~ '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$';

-- name: active_users_after
-- The audit's truths a chunk at a time: the next users with an Active assignment after `after`, in id order
-- (ix_role_assignments_user_active, its predicate the same).
SELECT DISTINCT user_id FROM identity.role_assignments
WHERE status = 'Active' AND user_id > %(after)s
ORDER BY user_id
LIMIT %(limit)s;

-- name: create_audit_topic_records
-- The access topic's records as one audit read them (seq: the order read, which is each partition's order),
-- kept in the audit's own session rather than in its process: a million users cost the audit no memory.
CREATE TEMP TABLE audit_topic_records (seq bigint NOT NULL, user_id uuid NOT NULL, fingerprint bigint);

-- name: copy_audit_topic_records
COPY pg_temp.audit_topic_records (seq, user_id, fingerprint) FROM STDIN;

-- name: index_audit_topic_records
-- Once the topic is read: indexed as audit_last_events reads it, a chunk at a time (one sort of the table,
-- cheaper than keeping the index up through every COPY, which the audit waits for), and analysed, which
-- autovacuum never does for a temporary table (without its figures each chunk could be planned as a sort
-- of the whole table).
CREATE INDEX IF NOT EXISTS audit_topic_records_by_user ON pg_temp.audit_topic_records (user_id, seq DESC);
ANALYZE pg_temp.audit_topic_records;

-- name: audit_last_events
-- Each user's last record (a null fingerprint: a tombstone) after `after`, by user id as the truths come: a
-- walk of audit_topic_records_by_user, `limit` users at a time.
SELECT DISTINCT ON (user_id) user_id, fingerprint
FROM pg_temp.audit_topic_records
WHERE user_id > %(after)s
ORDER BY user_id, seq DESC
LIMIT %(limit)s;

-- name: user_exists
SELECT EXISTS (SELECT 1 FROM identity.users WHERE id = %(user_id)s);

-- name: queued_access_events_of_user
-- `access show`: the user's access events still in the outbox (oldest first), then those the broker refused
-- for good (dead letters). Neither table has an index on the key: the outbox is read whole, which costs
-- nothing while the relay keeps it drained and grows with a backlog (BENCHMARKS.md, "access show").
SELECT false AS dead, id AS outbox_id, event_id, value::jsonb #>> '{payload,changeReason}' AS change_reason,
       value::jsonb #>> '{payload,version}' AS version, created_at AS queued_at, NULL::text AS error
FROM identity.outbox_events
WHERE topic = %(topic)s AND message_key = %(key)s
UNION ALL
SELECT true, id, event_id, value::jsonb #>> '{payload,changeReason}', value::jsonb #>> '{payload,version}',
       failed_at, error
FROM identity.outbox_dead_letters
WHERE topic = %(topic)s AND message_key = %(key)s
ORDER BY 1, 2;
