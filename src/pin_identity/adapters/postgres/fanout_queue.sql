-- The access fan-out's queue (fanout_queue.py): its tasks, their claims and leases, a page's lock and write,
-- the operator's look at them. Parameters use psycopg's %(name)s style.

-- name: listen_fanout_tasks
LISTEN pin_identity_fanout;

-- name: fail_exhausted_fanout_tasks
-- Poison: MaxAttempts consecutive leases ended without committing a batch (run out, or their holder gone): the
-- attempts are spent and no one holds the task (a Pending one, never claimed, has spent none).
UPDATE identity.access_fanout_tasks
SET status = 'Failed', lease_expires_at = NULL, lease_owner = NULL, updated_at = %(now)s
WHERE (
-- include: lease_spent
) AND (status = 'Pending' OR (
-- include: lease_over (status = status, lease_until = lease_expires_at, owner = lease_owner, holder_key = holder_key)
))
RETURNING id AS task_id, role_id, attempt_count AS attempts, last_error;

-- name: claim_fanout_task
-- The oldest Pending task, or InProgress one whose lease expired or whose holder's session is gone; tasks
-- other workers hold are skipped. The claim names this process's holder session. A Pending task is available
-- at once: a released one waits out its back-off InProgress, until its lease's end.
WITH next AS (
    SELECT id FROM identity.access_fanout_tasks
    WHERE (
-- include: lease_available (status = status, available_at = NULL)
    ) OR (
-- include: lease_over (status = status, lease_until = lease_expires_at, owner = lease_owner, holder_key = holder_key)
    )
    ORDER BY created_at, id
    LIMIT 1
    FOR UPDATE SKIP LOCKED
)
UPDATE identity.access_fanout_tasks t
SET status = 'InProgress',
    lease_expires_at = %(lease_until)s,
    lease_owner = %(claim_id)s,
    holder_key = %(holder)s,
    attempt_count = t.attempt_count + 1,
    started_at = COALESCE(t.started_at, %(now)s),
    updated_at = %(now)s
FROM next
WHERE t.id = next.id
RETURNING t.id AS task_id, t.role_id, t.company_id, t.role_version, t.cursor, t.processed_count,
          t.attempt_count AS attempt, t.created_at, t.started_at;

-- name: renew_fanout_lease
-- Fencing: only the claim that holds the lease may write, and only from the checkpoint it left; the row stays
-- locked for the batch. A checkpoint other than the claim's last is one the server lost (pages commit without
-- waiting for their WAL: a crash, or a failover to a standby that had not received them): the claim stops, and
-- the next claim resumes from the checkpoint as stored, so the lost pages are written again, never skipped.
UPDATE identity.access_fanout_tasks
SET lease_expires_at = %(lease_until)s, updated_at = %(now)s
WHERE id = %(task_id)s AND cursor IS NOT DISTINCT FROM %(cursor)s AND (
-- include: lease_still_mine (owner = lease_owner, status = status)
)
RETURNING id;

-- name: fanout_page_commits_without_flush
-- A page's commit does not wait for its WAL to reach the disk (what that saves: BENCHMARKS.md). Safe here: a
-- page changes no truth, and the page's events and checkpoint are lost or kept together. A page lost in a
-- server crash (or a failover to a standby it had not reached) is written again from the older checkpoint (its
-- events may already be on the topic: at least once, as any retry): the claim's next batch finds that
-- checkpoint, not its own, and stops (renew_fanout_lease), and the next claim resumes from it. It cannot come back behind a newer truth: a writer of one of its users waits for the
-- page's lock and commits after it, and that writer's synchronous commit flushes the WAL up to itself, the
-- page's commit included. So a page is lost only while nothing newer was said about its users.
SET LOCAL synchronous_commit = off;

-- name: lock_fanout_page
-- One keyset page of the role's unique users, locked in id order before their snapshots are read: a point
-- change of one of them (which holds the user FOR UPDATE) commits first, or waits for this page to commit, so
-- the order of a user's outbox rows is the order of the truths they carry. KEY SHARE lets other snapshot
-- writers (another role's page) through. The snapshots are read by the next statement, which in READ
-- COMMITTED takes a snapshot after the wait (this one's would still show what the waited-for change undid).
-- The page's ids are gathered into an array first (an InitPlan over the (role_id, user_id) index), so the
-- users are found through their primary key whatever the cost settings: as a join (`IN (subquery)`) the
-- planner weighed a hash join over a sequential scan of every user against 500 index probes, and chose the
-- scan for a 50,000-user role under the default random_page_cost, several times slower a page (BENCHMARKS.md
-- has the figures; tests/integration/test_query_plans.py holds the shape).
-- One row comes back: the page's size, its last id (the next cursor) and its ids as the text of a uuid[] that
-- write_access_changes takes as it is: turning 500 ids into Python objects and back was a sixth of the
-- worker's time a page.
WITH page AS (
    SELECT u.id FROM identity.users u
    WHERE u.id = ANY(ARRAY(
        SELECT DISTINCT ra.user_id FROM identity.role_assignments ra
        WHERE ra.role_id = %(role_id)s AND ra.status = 'Active' AND ra.user_id > %(cursor)s
        ORDER BY ra.user_id
        LIMIT %(limit)s
    ))
    ORDER BY u.id
    FOR KEY SHARE OF u
)
SELECT count(*) AS page_size, (array_agg(id ORDER BY id DESC))[1] AS last_user_id,
       array_agg(id ORDER BY id)::text AS user_ids
FROM page;

-- name: write_access_changes
-- One UserAccessChanged per given user, rendered and written by the server, so that no envelope passes
-- through the client (the fan-out page: cheaper than encoding its events in Python and sending them back by
-- COPY). The SQL rendering of pin_identity.domain.events.AccessChangeTemplate.fill (that module owns the
-- event's shape and names its three rendering sites): the page's template turned into a format() string by
-- outbox_writer.template_params, whose arguments are JSON values: 1 the event id, 2 the user id, 3 the
-- company id, 4 activeAssignments as rendered_access_snapshots renders them.
INSERT INTO identity.outbox_events (event_id, topic, message_key, event_type, correlation_id, traceparent, value)
SELECT event.event_id, %(topic)s, event.user_id::text, %(event_type)s, %(correlation_id)s, %(traceparent)s,
       format(%(envelope)s, to_json(event.event_id)::text, to_json(event.user_id)::text,
              COALESCE(to_json(event.company_id)::text, 'null'), event.assignments)
FROM (SELECT gen_random_uuid() AS event_id, snapshot.user_id, snapshot.company_id, snapshot.assignments
      FROM (
-- include: rendered_access_snapshots
      ) AS snapshot (user_id, company_id, assignments)
     ) AS event;

-- name: advance_fanout_task
-- A committed batch renews the lease and resets the attempts: only leases without progress count. Its
-- transaction opened under the fence (renew_fanout_lease), which holds the row: this checks again for free.
UPDATE identity.access_fanout_tasks
SET cursor = %(cursor)s,
    processed_count = processed_count + %(processed)s,
    attempt_count = 1,
    status = CASE WHEN %(completed)s THEN 'Completed' ELSE 'InProgress' END,
    completed_at = CASE WHEN %(completed)s THEN %(now)s END,
    lease_expires_at = CASE WHEN %(completed)s THEN NULL ELSE %(lease_until)s END,
    lease_owner = CASE WHEN %(completed)s THEN NULL ELSE lease_owner END,
    last_error = NULL,
    updated_at = %(now)s
WHERE id = %(task_id)s AND (
-- include: lease_still_mine (owner = lease_owner, status = status)
)
RETURNING processed_count;

-- name: release_fanout_task
-- Give the lease back now (graceful stop: the attempt does not count) or after a back-off (an error).
UPDATE identity.access_fanout_tasks
SET lease_expires_at = %(available_at)s,
    lease_owner = NULL,
    attempt_count = CASE WHEN %(count_attempt)s THEN attempt_count ELSE GREATEST(attempt_count - 1, 0) END,
    last_error = COALESCE(%(error)s, last_error),
    updated_at = %(now)s
WHERE id = %(task_id)s AND (
-- include: lease_still_mine (owner = lease_owner, status = status)
);

-- name: fanout_queue_stats
-- The backlog: every task no worker is on, Pending, InProgress with an expired lease or a holder gone, or handed back after a
-- failed attempt and waiting out its back-off (no owner, available again at lease_expires_at).
SELECT count(*) FILTER (WHERE status = 'Pending'
                           OR (status = 'InProgress' AND (lease_owner IS NULL OR lease_expires_at <= %(now)s
                                                          OR identity.claim_holder_gone(holder_key))))
           AS backlog,
       count(*) FILTER (WHERE status = 'Failed') AS failed
FROM identity.access_fanout_tasks
WHERE status IN ('Pending', 'InProgress', 'Failed');

-- name: outbox_waiting_estimate
-- The fan-out's pace: how many events wait in the outbox (the relay's in flight among them), counted, but no
-- further than `cap` (the pace only asks whether they are more than its limit): the first `cap` ids of the
-- primary key, a few milliseconds. Not the id range: one row kept long at the head (a held topic's, a poison
-- row's) made the range of two rows a million ids wide. Reads the id column alone, the one the fan-out's
-- role may read.
SELECT count(id) AS waiting FROM (SELECT id FROM identity.outbox_events ORDER BY id LIMIT %(cap)s) AS head;

-- name: list_fanout_tasks
SELECT id AS task_id, role_id, company_id, role_version, reason, status, cursor, processed_count, attempt_count,
       lease_expires_at, created_at, started_at, completed_at, updated_at, last_error
FROM identity.access_fanout_tasks
WHERE %(status)s::text IS NULL OR status = %(status)s
ORDER BY created_at DESC
LIMIT %(limit)s;

-- name: replay_fanout_task
-- The runbook's replay of a poison task: back to Pending with fresh attempts, resuming from its cursor.
UPDATE identity.access_fanout_tasks
SET status = 'Pending', attempt_count = 0, lease_expires_at = NULL, lease_owner = NULL, completed_at = NULL,
    updated_at = %(now)s
WHERE id = %(task_id)s AND status = 'Failed'
RETURNING id;

-- name: discard_fanout_task
-- An operator's decision that a Failed task's users past its cursor need it no more (a newer task of the role
-- notified every holder, or they were re-announced): the task goes, and with it the failed-task gauge's count.
-- What it was comes back for the audit line.
DELETE FROM identity.access_fanout_tasks
WHERE id = %(task_id)s AND status = 'Failed'
RETURNING id AS task_id, role_id, company_id, role_version, reason, status, cursor, processed_count,
          attempt_count, lease_expires_at, created_at, started_at, completed_at, updated_at, last_error;

-- name: newer_role_announcement
-- A discard's check of what told the users past a Failed task's cursor since: the role's current version, and
-- its newest task past the Failed one's version that did not fail (a Completed one first), and whether one
-- past it failed too (then the newer version went to a task, not inline).
SELECT (SELECT version FROM identity.role_definitions WHERE id = %(role_id)s) AS role_version,
       newer.id AS task_id, newer.status AS task_status,
       EXISTS (SELECT FROM identity.access_fanout_tasks
               WHERE role_id = %(role_id)s AND role_version > %(role_version)s AND status = 'Failed') AS failed
FROM (SELECT 1) AS one
LEFT JOIN LATERAL (
    SELECT id, status FROM identity.access_fanout_tasks
    WHERE role_id = %(role_id)s AND role_version > %(role_version)s AND status <> 'Failed'
    ORDER BY status = 'Completed' DESC, role_version DESC
    LIMIT 1
) AS newer ON true;

-- name: fanout_task_status
-- An operator's look at a task (fan-out replay), and the demo's wait for its fan-out.
SELECT status, processed_count FROM identity.access_fanout_tasks WHERE id = %(task_id)s;
