-- Every statement the application runs, by name. Parameters use psycopg's %(name)s style.

-- ---------------------------------------------------------------- companies and users

-- name: insert_company
INSERT INTO identity.companies (id, name, company_type, status, tax_id, sync_source,
                                external_talent_tenant_id, replica_version, last_synced_at)
VALUES (%(id)s, %(name)s, %(company_type)s, %(status)s, %(tax_id)s, %(sync_source)s,
        %(external_talent_tenant_id)s, %(replica_version)s,
        CASE WHEN %(replica_version)s::bigint IS NULL THEN NULL ELSE now() END);

-- name: insert_user
INSERT INTO identity.users (id, company_id, type, status, phone, email, first_name, last_name, middle_name,
                            contacts_managed_by, sync_source, external_talent_user_id, replica_version,
                            last_synced_at)
VALUES (%(id)s, %(company_id)s, %(type)s, %(status)s, %(phone)s, %(email)s, %(first_name)s, %(last_name)s,
        %(middle_name)s, %(contacts_managed_by)s, %(sync_source)s, %(external_talent_user_id)s,
        %(replica_version)s, CASE WHEN %(replica_version)s::bigint IS NULL THEN NULL ELSE now() END);

-- name: lock_user
-- Every writer of a user's assignments holds the user row FOR UPDATE, and every writer of a user's snapshot
-- holds it FOR KEY SHARE, so versions and the order of a user's outbox rows follow the order of commits.
-- Lock order everywhere: the role first, then users in id order (no two writers wait on each other in a circle).
SELECT id, company_id FROM identity.users WHERE id = %(user_id)s FOR UPDATE;

-- name: lock_users_of_role
SELECT u.id FROM identity.users u
WHERE u.id IN (SELECT ra.user_id FROM identity.role_assignments ra
               WHERE ra.role_id = %(role_id)s AND ra.status = 'Active')
ORDER BY u.id
FOR UPDATE OF u;

-- ---------------------------------------------------------------- roles

-- name: insert_role
INSERT INTO identity.role_definitions (id, code, name, company_id) VALUES (%(id)s, %(code)s, %(name)s, %(company_id)s);

-- name: lock_role
-- NO KEY UPDATE, not UPDATE: an assignment insert's foreign-key check (KEY SHARE) of a writer that already
-- holds some users must not wait for a role change that waits for those users.
SELECT id AS role_id, code, company_id, status, version FROM identity.role_definitions
WHERE id = %(role_id)s
FOR NO KEY UPDATE;

-- name: share_role
-- A grant only needs the role to stay Active until it commits; grants of one role do not wait for each other.
SELECT id AS role_id, code, company_id, status, version FROM identity.role_definitions
WHERE id = %(role_id)s
FOR SHARE;

-- name: delete_role_permissions
DELETE FROM identity.role_permissions WHERE role_id = %(role_id)s;

-- name: insert_role_permissions
INSERT INTO identity.role_permissions (role_id, permission_code)
SELECT %(role_id)s, code FROM unnest(%(codes)s::text[]) AS code;

-- name: set_role_version
UPDATE identity.role_definitions SET version = %(version)s, updated_at = now() WHERE id = %(role_id)s;

-- name: archive_role
UPDATE identity.role_definitions SET status = 'Archived', version = %(version)s, updated_at = now()
WHERE id = %(role_id)s;

-- ---------------------------------------------------------------- role assignments

-- name: next_assignment_version
-- Assignment versions grow per user, so max(version) of a user orders all of its point changes.
SELECT COALESCE(max(version), 0) + 1 FROM identity.role_assignments WHERE user_id = %(user_id)s;

-- name: insert_assignment
INSERT INTO identity.role_assignments (id, role_id, user_id, company_id, scope_type, scope_organization_id,
                                       scope_project_group_id, scope_project_id, expires_at, version)
VALUES (%(id)s, %(role_id)s, %(user_id)s, %(company_id)s, %(scope_type)s, %(scope_organization_id)s,
        %(scope_project_group_id)s, %(scope_project_id)s, %(expires_at)s, %(version)s);

-- name: active_grant_exists
-- Read under the user's lock: no other writer can add or end the same grant meanwhile.
SELECT EXISTS (
    SELECT 1 FROM identity.role_assignments
    WHERE user_id = %(user_id)s AND role_id = %(role_id)s AND status = 'Active' AND scope_type = %(scope_type)s
      AND scope_organization_id IS NOT DISTINCT FROM %(scope_organization_id)s
      AND scope_project_group_id IS NOT DISTINCT FROM %(scope_project_group_id)s
      AND scope_project_id IS NOT DISTINCT FROM %(scope_project_id)s
);

-- name: assignment_owner
SELECT user_id, role_id, status FROM identity.role_assignments WHERE id = %(assignment_id)s;

-- name: revoke_assignment
UPDATE identity.role_assignments SET status = 'Revoked', version = %(version)s, updated_at = now()
WHERE id = %(assignment_id)s AND status = 'Active';

-- name: revoke_role_assignments
-- INV-R5; run after lock_users_of_role, so each user's next version is read under its lock.
UPDATE identity.role_assignments ra
SET status = 'Revoked', updated_at = now(),
    version = (SELECT max(x.version) + 1 FROM identity.role_assignments x WHERE x.user_id = ra.user_id)
WHERE ra.role_id = %(role_id)s AND ra.status = 'Active'
RETURNING ra.user_id;

-- name: user_access_versions
SELECT user_id, max(version) AS version FROM identity.role_assignments
WHERE user_id = ANY(%(user_ids)s::uuid[]) GROUP BY user_id;

-- name: count_active_users
SELECT count(*) FROM (
    SELECT DISTINCT user_id FROM identity.role_assignments
    WHERE role_id = %(role_id)s AND status = 'Active'
    LIMIT %(limit)s
) AS counted;

-- name: lock_active_users_of_role
-- The inline fan-out's users, locked as lock_fanout_page locks a page (and for the same reason); the caller
-- reads their snapshots in a later statement.
SELECT u.id FROM identity.users u
WHERE u.id IN (SELECT ra.user_id FROM identity.role_assignments ra
               WHERE ra.role_id = %(role_id)s AND ra.status = 'Active')
ORDER BY u.id
FOR KEY SHARE OF u;

-- name: access_snapshots
-- One query for the whole set: each user with every Active assignment across all roles (no N+1).
SELECT u.id AS user_id, u.company_id, ra.id AS assignment_id, ra.role_id, rd.code AS role_code, ra.scope_type,
       ra.scope_organization_id, ra.scope_project_group_id, ra.scope_project_id, ra.expires_at
FROM identity.users u
LEFT JOIN identity.role_assignments ra ON ra.user_id = u.id AND ra.status = 'Active'
LEFT JOIN identity.role_definitions rd ON rd.id = ra.role_id
WHERE u.id = ANY(%(user_ids)s::uuid[])
ORDER BY u.id, ra.id;

-- ---------------------------------------------------------------- access fan-out queue

-- name: enqueue_fanout_task
-- Coalesce: one Pending task per role, carrying the newest RoleVersion.
INSERT INTO identity.access_fanout_tasks (id, role_id, company_id, role_version, reason, status, created_at, updated_at)
VALUES (%(id)s, %(role_id)s, %(company_id)s, %(role_version)s, 'RolePermissionsChanged', 'Pending', %(now)s, %(now)s)
ON CONFLICT (role_id) WHERE status = 'Pending'
DO UPDATE SET role_version = GREATEST(access_fanout_tasks.role_version, EXCLUDED.role_version),
              updated_at = EXCLUDED.updated_at
RETURNING id;

-- name: notify_fanout_task
SELECT pg_notify('pin_identity_fanout', %(task_id)s::text);

-- name: listen_fanout_tasks
LISTEN pin_identity_fanout;

-- name: fail_exhausted_fanout_tasks
-- Poison: MaxAttempts consecutive leases ended without committing a batch (run out, or their holder gone).
UPDATE identity.access_fanout_tasks
SET status = 'Failed', lease_expires_at = NULL, lease_owner = NULL, updated_at = %(now)s
WHERE status = 'InProgress' AND attempt_count >= %(max_attempts)s
  AND (lease_expires_at <= %(now)s OR (lease_owner IS NOT NULL AND identity.claim_holder_gone(holder_key)))
RETURNING id AS task_id, role_id, attempt_count AS attempts, last_error;

-- name: claim_fanout_task
-- The oldest Pending task, or InProgress one whose lease expired or whose holder's session is gone; tasks
-- other workers hold are skipped. The claim names this process's holder session.
WITH next AS (
    SELECT id FROM identity.access_fanout_tasks
    WHERE status = 'Pending'
       OR (status = 'InProgress' AND (lease_expires_at <= %(now)s
                                      OR (lease_owner IS NOT NULL AND identity.claim_holder_gone(holder_key))))
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
-- Fencing: only the claim that holds the lease may write; the row stays locked for the batch.
UPDATE identity.access_fanout_tasks
SET lease_expires_at = %(lease_until)s, updated_at = %(now)s
WHERE id = %(task_id)s AND lease_owner = %(claim_id)s AND status = 'InProgress'
RETURNING id;

-- name: fanout_page_commits_without_flush
-- A page's commit does not wait for its WAL to reach the disk (what that saves: BENCHMARKS.md). Safe here: a
-- page changes no truth, and the page's events and checkpoint are lost or kept together. A page lost in a
-- server crash is written again from the older checkpoint (its events may already be on the topic: at least
-- once, as any retry). It cannot come back behind a newer truth: a writer of one of its users waits for the
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

-- name: rendered_access_snapshots
-- Each user's full access snapshot, rendered as UserAccessChanged's activeAssignments array: the SQL
-- rendering of pin_identity.domain.events._assignments (that module owns the event's shape and names its
-- three rendering sites; tests/integration/test_access_event_renderings.py holds them to the same JSON).
-- Used by the import's apply, by write_access_changes, by the access audit and by `access show`.
-- Driven by the given (distinct) ids: each user is one primary-key probe (OFFSET 0 keeps the lookup a
-- parameterised subquery, so it cannot become a hash join over all users) and each user's assignments one
-- probe of ix_role_assignments_user_active, however small a share of the table the ids are.
-- Each assignment is one format() over values already in JSON form (uuids and the timestamp need no
-- escaping; the texts go through to_json): cheaper than json_build_object and json_agg (BENCHMARKS.md).
SELECT page.user_id, u.company_id,
       COALESCE((
           SELECT '[' || string_agg(format(
                      '{"assignmentId": "%%s", "roleId": "%%s", "roleCode": %%s, "scopeType": %%s, '
                      '"scopeOrganizationId": %%s, "scopeProjectGroupId": %%s, "scopeProjectId": %%s, '
                      '"expiresAt": %%s}',
                      ra.id, ra.role_id, to_json(rd.code), to_json(ra.scope_type),
                      COALESCE('"' || ra.scope_organization_id || '"', 'null'),
                      COALESCE('"' || ra.scope_project_group_id || '"', 'null'),
                      COALESCE('"' || ra.scope_project_id || '"', 'null'),
                      COALESCE('"' || to_char(ra.expires_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') || '"',
                               'null')
                  ), ', ' ORDER BY ra.id) || ']'
           FROM identity.role_assignments ra
           JOIN identity.role_definitions rd ON rd.id = ra.role_id
           WHERE ra.user_id = page.user_id AND ra.status = 'Active'
       ), '[]')
FROM unnest(%(user_ids)s::uuid[]) AS page(user_id)
CROSS JOIN LATERAL (SELECT u.company_id FROM identity.users u WHERE u.id = page.user_id OFFSET 0) AS u
ORDER BY page.user_id;

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
-- A committed batch renews the lease and resets the attempts: only leases without progress count.
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
WHERE id = %(task_id)s AND lease_owner = %(claim_id)s
RETURNING processed_count;

-- name: release_fanout_task
-- Give the lease back now (graceful stop: the attempt does not count) or after a back-off (an error).
UPDATE identity.access_fanout_tasks
SET lease_expires_at = %(available_at)s,
    lease_owner = NULL,
    attempt_count = CASE WHEN %(count_attempt)s THEN attempt_count ELSE GREATEST(attempt_count - 1, 0) END,
    last_error = COALESCE(%(error)s, last_error),
    updated_at = %(now)s
WHERE id = %(task_id)s AND lease_owner = %(claim_id)s AND status = 'InProgress';

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

-- ---------------------------------------------------------------- Talent replica

-- name: lock_talent_ids
-- Serialises every writer of the same Talent entity (the consumer and an import may run at once); ids are
-- locked in order so that two batches never wait on each other in a circle.
SELECT pg_advisory_xact_lock(hashtextextended(%(namespace)s || ids.id::text, 0))
FROM (SELECT id FROM unnest(%(ids)s::uuid[]) AS id ORDER BY id) AS ids;

-- name: companies_by_tenant
SELECT id AS company_id, name, company_type, status, tax_id, sync_source, external_talent_tenant_id,
       replica_version
FROM identity.companies WHERE external_talent_tenant_id = ANY(%(tenant_ids)s::uuid[]);

-- name: share_companies_by_tenant
-- A user round reads its companies' status under a share lock: a round blocking or restoring one of them
-- (which follows up on the company's managers) commits first or waits for this one.
SELECT id AS company_id, name, company_type, status, tax_id, sync_source, external_talent_tenant_id,
       replica_version
FROM identity.companies WHERE external_talent_tenant_id = ANY(%(tenant_ids)s::uuid[])
ORDER BY id
FOR SHARE;

-- name: lock_managers
-- The Talent managers of companies (not Blocked themselves): whom blocking or restoring a company concerns,
-- each row held as every writer of a user's assignments holds it, in id order. Row locks, not an advisory
-- lock per manager: a row lock lives in the row itself, so a company of 40,000 managers takes no more of
-- PostgreSQL's shared lock table than one of 4 (40,000 advisory locks overflowed it: "out of shared memory").
-- Every other writer of these existing users holds their rows too (the advisory lock on a Talent id serialises
-- the writers of a user that may not exist yet, which a company's managers all do).
SELECT id, company_id FROM identity.users
WHERE company_id = ANY(%(company_ids)s::uuid[]) AND sync_source = 'TalentIdentity' AND status <> 'Blocked'
  AND external_talent_user_id IS NOT NULL
ORDER BY id
FOR UPDATE;

-- name: managers_without_default_role
SELECT u.id, u.company_id FROM identity.users u
WHERE u.id = ANY(%(user_ids)s::uuid[])
  AND NOT EXISTS (SELECT 1 FROM identity.role_assignments ra
                  WHERE ra.user_id = u.id AND ra.role_id = %(role_id)s AND ra.status = 'Active'
                    AND ra.scope_organization_id = u.company_id);

-- name: users_by_talent_id
SELECT id AS user_id, company_id, type, status, phone, email, first_name, last_name, middle_name,
       contacts_managed_by, sync_source, external_talent_user_id, replica_version
FROM identity.users WHERE external_talent_user_id = ANY(%(talent_ids)s::uuid[]);

-- name: lock_users_by_talent_id
-- Locks the rows too: a point change of the same user (grant, revoke) waits, so versions stay ordered.
SELECT id AS user_id, company_id, type, status, phone, email, first_name, last_name, middle_name,
       contacts_managed_by, sync_source, external_talent_user_id, replica_version
FROM identity.users WHERE external_talent_user_id = ANY(%(talent_ids)s::uuid[])
ORDER BY id
FOR UPDATE;

-- name: phone_owners
SELECT phone, id FROM identity.users WHERE phone = ANY(%(phones)s::text[]);

-- name: default_role
-- The system role every Talent manager holds in its organization (created by the first migration).
SELECT id AS role_id, code, company_id, status, version FROM identity.role_definitions
WHERE code = %(code)s AND company_id IS NULL;

-- name: talent_deleted_versions
SELECT external_id, version FROM identity.talent_deletions
WHERE stage = %(stage)s AND external_id = ANY(%(talent_ids)s::uuid[]);

-- name: talent_waiting_versions
-- The consumer's deferred snapshots (run_id null, a next try set) of these entities: their oldest version.
SELECT external_id, min((payload ->> 'version')::bigint)
FROM identity.talent_import_failed_items
WHERE run_id IS NULL AND next_attempt_at IS NOT NULL AND stage = %(stage)s
  AND external_id = ANY(%(talent_ids)s::uuid[]) AND error_code = 'IDENTITY_SYNC_COMPANY_NOT_FOUND'
  AND payload ->> 'version' ~ '^[0-9]{1,18}$'
GROUP BY external_id;

-- name: remember_talent_deletions
INSERT INTO identity.talent_deletions (stage, external_id, version)
SELECT %(stage)s, d.external_id, d.version
FROM unnest(%(talent_ids)s::uuid[], %(versions)s::bigint[]) AS d(external_id, version)
ON CONFLICT (stage, external_id) DO UPDATE
SET version = GREATEST(talent_deletions.version, EXCLUDED.version), deleted_at = now();

-- name: insert_replica_companies
INSERT INTO identity.companies (id, name, company_type, status, tax_id, sync_source, external_talent_tenant_id,
                                replica_version, last_synced_at)
SELECT c.id, c.name, c.company_type, c.status, c.tax_id, 'TalentIdentity', c.external_id, c.replica_version,
       %(synced_at)s
FROM unnest(%(ids)s::uuid[], %(names)s::text[], %(types)s::text[], %(statuses)s::text[], %(tax_ids)s::text[],
            %(external_ids)s::uuid[], %(versions)s::bigint[])
     AS c(id, name, company_type, status, tax_id, external_id, replica_version);

-- name: update_replica_companies
UPDATE identity.companies co
SET name = c.name, status = c.status, tax_id = c.tax_id, replica_version = c.replica_version,
    last_synced_at = %(synced_at)s, updated_at = now()
FROM unnest(%(ids)s::uuid[], %(names)s::text[], %(statuses)s::text[], %(tax_ids)s::text[],
            %(versions)s::bigint[]) AS c(id, name, status, tax_id, replica_version)
WHERE co.id = c.id;

-- name: insert_replica_users
INSERT INTO identity.users (id, company_id, type, status, phone, email, first_name, last_name, middle_name,
                            contacts_managed_by, sync_source, external_talent_user_id, replica_version,
                            last_synced_at)
SELECT u.id, u.company_id, u.type, u.status, u.phone, u.email, u.first_name, u.last_name, u.middle_name,
       'TalentSync', 'TalentIdentity', u.external_id, u.replica_version, %(synced_at)s
FROM unnest(%(ids)s::uuid[], %(company_ids)s::uuid[], %(types)s::text[], %(statuses)s::text[],
            %(phones)s::text[], %(emails)s::text[], %(first_names)s::text[], %(last_names)s::text[],
            %(middle_names)s::text[], %(external_ids)s::uuid[], %(versions)s::bigint[])
     AS u(id, company_id, type, status, phone, email, first_name, last_name, middle_name, external_id,
          replica_version);

-- name: update_replica_users
UPDATE identity.users us
SET company_id = u.company_id, status = u.status, phone = u.phone, email = u.email, first_name = u.first_name,
    last_name = u.last_name, middle_name = u.middle_name, replica_version = u.replica_version,
    last_synced_at = %(synced_at)s, updated_at = now()
FROM unnest(%(ids)s::uuid[], %(company_ids)s::uuid[], %(types)s::text[], %(statuses)s::text[],
            %(phones)s::text[], %(emails)s::text[], %(first_names)s::text[], %(last_names)s::text[],
            %(middle_names)s::text[], %(external_ids)s::uuid[], %(versions)s::bigint[])
     AS u(id, company_id, type, status, phone, email, first_name, last_name, middle_name, external_id,
          replica_version)
WHERE us.id = u.id;

-- name: revoke_user_assignments
-- Run under the users' row locks (lock_users_by_talent_id), so each user's next version is read safely.
UPDATE identity.role_assignments ra
SET status = 'Revoked', updated_at = now(),
    version = (SELECT max(x.version) + 1 FROM identity.role_assignments x WHERE x.user_id = ra.user_id)
WHERE ra.user_id = ANY(%(user_ids)s::uuid[]) AND ra.status = 'Active'
  AND (%(role_id)s::uuid IS NULL OR ra.role_id = %(role_id)s::uuid)
RETURNING ra.user_id, ra.role_id;

-- name: grant_default_role
INSERT INTO identity.role_assignments (id, role_id, user_id, company_id, scope_type, scope_organization_id,
                                       version)
SELECT g.id, %(role_id)s, g.user_id, %(role_company_id)s, 'Organization', g.company_id,
       COALESCE((SELECT max(x.version) FROM identity.role_assignments x WHERE x.user_id = g.user_id), 0) + 1
FROM unnest(%(ids)s::uuid[], %(user_ids)s::uuid[], %(company_ids)s::uuid[]) AS g(id, user_id, company_id);

-- ---------------------------------------------------------------- quarantine (talent_import_failed_items)

-- name: update_quarantined
-- A re-applied item that failed again keeps its row (and id) with the new reason.
UPDATE identity.talent_import_failed_items f
SET error_code = q.error_code, payload = q.payload::jsonb, attempt_count = q.attempt_count,
    next_attempt_at = q.next_attempt_at, reason = q.reason, updated_at = now()
FROM unnest(%(ids)s::uuid[], %(error_codes)s::text[], %(payloads)s::text[], %(attempts)s::int[],
            %(next_attempts)s::timestamptz[], %(reasons)s::text[])
     AS q(id, error_code, payload, attempt_count, next_attempt_at, reason)
WHERE f.id = q.id;

-- name: insert_quarantined
-- The consumer may see the same record again after a crash (at-least-once): the same failure of the same
-- payload is kept once.
INSERT INTO identity.talent_import_failed_items (id, run_id, stage, external_id, error_code, payload,
                                                 attempt_count, next_attempt_at, reason)
SELECT q.id, q.run_id, q.stage, q.external_id, q.error_code, q.payload::jsonb, q.attempt_count,
       q.next_attempt_at, q.reason
FROM unnest(%(ids)s::uuid[], %(run_ids)s::uuid[], %(stages)s::text[], %(external_ids)s::uuid[],
            %(error_codes)s::text[], %(payloads)s::text[], %(attempts)s::int[], %(next_attempts)s::timestamptz[],
            %(reasons)s::text[])
     AS q(id, run_id, stage, external_id, error_code, payload, attempt_count, next_attempt_at, reason)
WHERE NOT EXISTS (
    SELECT 1 FROM identity.talent_import_failed_items f
    WHERE q.run_id IS NULL AND f.run_id IS NULL AND f.stage = q.stage AND f.external_id = q.external_id
      AND f.error_code = q.error_code AND f.payload IS NOT DISTINCT FROM q.payload::jsonb
)
ON CONFLICT (id) DO NOTHING;

-- name: release_quarantined
DELETE FROM identity.talent_import_failed_items WHERE id = ANY(%(ids)s::uuid[]);

-- name: discard_quarantined
-- A deletion that carries no version (a tombstone) is the entity's last word: every snapshot of it any
-- quarantine holds (the consumer's, deferred or held for the operator, and every run's) is older, and gone.
DELETE FROM identity.talent_import_failed_items
WHERE stage = %(stage)s AND external_id = ANY(%(talent_ids)s::uuid[]);

-- name: wake_deferred_users
-- The consumer's users deferred until their tenant arrived are due as soon as it has, not at their next back-off:
-- the consumer retries them in the same step (and `--once` does not end with them waiting).
UPDATE identity.talent_import_failed_items
SET next_attempt_at = %(now)s
WHERE run_id IS NULL AND next_attempt_at > %(now)s AND stage = 'Users'
  AND error_code = 'IDENTITY_SYNC_COMPANY_NOT_FOUND'
  AND lower(payload ->> 'tenantId') = ANY(%(tenant_ids)s::text[]);

-- name: due_quarantined
-- The consumer's deferred items (a user that arrived before its tenant) of the entities with one due: all of an
-- entity's deferred snapshots come back together, in version order, so that only what the version guard keeps
-- is applied (talent_replica.retry_deferred). A row kept without its snapshot is never retried.
WITH due AS (
    -- The first due rows by the index on next_attempt_at, then their entities: a company of tens of thousands
    -- of deferred managers is not grouped whole at every step.
    SELECT DISTINCT stage, external_id
    FROM (SELECT stage, external_id FROM identity.talent_import_failed_items
          WHERE run_id IS NULL AND next_attempt_at <= %(now)s AND payload IS NOT NULL
          ORDER BY next_attempt_at
          LIMIT %(limit)s) AS first_due
)
SELECT f.id, f.stage, f.external_id, f.error_code, f.payload, f.attempt_count, f.next_attempt_at
FROM identity.talent_import_failed_items f JOIN due USING (stage, external_id)
WHERE f.run_id IS NULL AND f.next_attempt_at IS NOT NULL AND f.payload IS NOT NULL
ORDER BY f.stage, f.external_id,
         CASE WHEN f.payload ->> 'version' ~ '^[0-9]{1,18}$' THEN (f.payload ->> 'version')::bigint END,
         f.created_at
FOR UPDATE OF f SKIP LOCKED;

-- name: import_failed_items
-- A run's quarantine, or the continuous consumer's (run_id null).
SELECT id AS item_id, stage, external_id, error_code, reason, attempt_count AS attempts, created_at, updated_at
FROM identity.talent_import_failed_items
WHERE run_id IS NOT DISTINCT FROM %(run_id)s::uuid
ORDER BY created_at, id;

-- name: import_failed_items_for_replay
SELECT id, stage, external_id, error_code, payload, attempt_count, next_attempt_at
FROM identity.talent_import_failed_items
WHERE run_id IS NOT DISTINCT FROM %(run_id)s::uuid AND (%(all)s OR id = ANY(%(ids)s::uuid[]))
ORDER BY created_at, id
FOR UPDATE SKIP LOCKED;

-- ---------------------------------------------------------------- transactional outbox

-- name: copy_outbox_events
COPY identity.outbox_events (event_id, topic, message_key, event_type, correlation_id, traceparent, value)
FROM STDIN;

-- name: relay_session_settings
-- A custom plan per statement: under a generic plan an id array (once the 20,000 ids in flight, now the ids
-- removed at once) was searched row by row, and a fetch with 18,000 in flight held up the relay's loop (and
-- its session checks; BENCHMARKS.md has the figures). Planning the relay's few statements each time costs
-- little.
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
-- Rows of the topics it holds (`skip`: a topic the broker does not have) are left where they are. At most
-- `max_bytes` of values (the first row whatever its size): the sizes are read first, the values of the rows
-- that fit only. PendingEvent's fields in order, then the event id the row is removed by
-- (delete_outbox_events), then how many rows the page had before the cut (the relay's read position).
WITH page AS (
    SELECT id, octet_length(value) AS size
    FROM identity.outbox_events
    WHERE id > %(after)s AND id <= %(final)s AND topic <> ALL(%(skip)s::text[])
    ORDER BY id
    LIMIT %(limit)s
),
fits AS (
    SELECT id FROM (SELECT id, size, sum(size) OVER (ORDER BY id) AS running FROM page) AS sized
    WHERE running - size < %(max_bytes)s
)
SELECT e.id AS outbox_id, e.topic, e.message_key AS key, convert_to(e.value, 'UTF8') AS value, e.event_type,
       e.correlation_id::text AS correlation_id, e.traceparent, e.event_id::text AS event_id,
       (SELECT count(*) FROM page) AS page_rows
FROM identity.outbox_events e JOIN fits USING (id)
ORDER BY e.id;

-- name: fetch_topic_outbox_events
-- A topic the relay held, read again on its own from where it was left up to `upto` (where the other topics
-- stand), as fetch_ready_outbox_events reads (same columns).
WITH page AS (
    SELECT id, octet_length(value) AS size
    FROM identity.outbox_events
    WHERE id > %(after)s AND id <= %(upto)s AND id <= %(final)s AND topic = %(topic)s
    ORDER BY id
    LIMIT %(limit)s
),
fits AS (
    SELECT id FROM (SELECT id, size, sum(size) OVER (ORDER BY id) AS running FROM page) AS sized
    WHERE running - size < %(max_bytes)s
)
SELECT e.id AS outbox_id, e.topic, e.message_key AS key, convert_to(e.value, 'UTF8') AS value, e.event_type,
       e.correlation_id::text AS correlation_id, e.traceparent, e.event_id::text AS event_id,
       (SELECT count(*) FROM page) AS page_rows
FROM identity.outbox_events e JOIN fits USING (id)
ORDER BY e.id;

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

-- ---------------------------------------------------------------- access audit and access show

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

-- ---------------------------------------------------------------- health

-- name: ping
SELECT 1;

-- name: take_holder_lock
-- A claim holder's lock (adapters/postgres/holder_session.py), held for as long as its session lives.
SELECT pg_try_advisory_lock(%(space)s, %(key)s);

-- ---------------------------------------------------------------- demo checks

-- name: talent_managers_with_one_default_role
-- The demo's check of the bootstrap: every Talent manager holds exactly one Active default role.
SELECT count(*) FROM identity.users u
WHERE u.sync_source = 'TalentIdentity' AND u.status <> 'Blocked'
  AND (SELECT count(*) FROM identity.role_assignments ra
       JOIN identity.role_definitions rd ON rd.id = ra.role_id AND rd.code = %(code)s
       WHERE ra.user_id = u.id AND ra.status = 'Active'
         AND ra.scope_type = 'Organization' AND ra.scope_organization_id = u.company_id) = 1;

-- ---------------------------------------------------------------- talent-initial-import

-- name: create_import_run
INSERT INTO identity.talent_import_runs (id, mode, status, talent_tenant_id_filter, page_size, dry_run,
                                         correlation_id, started_at, updated_at)
VALUES (%(id)s, %(mode)s, 'Running', %(tenant_filter)s, %(page_size)s, %(dry_run)s, %(correlation_id)s,
        %(now)s, %(now)s);

-- name: import_runs
-- The one read of runs: by id, the Running one, or the latest (both parameters null or false), read by
-- column name (import_store._run_from_row).
SELECT id AS run_id, mode, status, talent_tenant_id_filter AS tenant_filter, page_size, dry_run, correlation_id,
       started_at, finished_at,
       companies_planned, companies_applied, companies_skipped, companies_failed,
       users_planned, users_applied, users_skipped, users_failed,
       tenants_listed, users_listed, plan_cursor, plan_page_no, error_code, error
FROM identity.talent_import_runs
WHERE (%(run_id)s::uuid IS NULL OR id = %(run_id)s::uuid)
  AND (NOT %(running_only)s OR status = 'Running')
ORDER BY started_at DESC
LIMIT 1;

-- name: replica_company_count
SELECT count(*) FROM identity.companies
WHERE sync_source = 'TalentIdentity' AND status <> 'Blocked'
  AND (%(tenant_filter)s::uuid IS NULL OR external_talent_tenant_id = %(tenant_filter)s::uuid);

-- name: advance_import_planning
-- One planning step moves the listing on, only from where the planner saw it (a planner holding a stale view
-- of the run changes nothing); add_import_pages follows in the same transaction.
UPDATE identity.talent_import_runs r
SET companies_planned = r.companies_planned + CASE WHEN %(stage)s = 'Tenants' THEN %(items)s ELSE 0 END,
    users_planned = r.users_planned + CASE WHEN %(stage)s = 'Users' THEN %(items)s ELSE 0 END,
    tenants_listed = r.tenants_listed OR (%(stage)s = 'Tenants' AND %(complete)s),
    users_listed = r.users_listed OR (%(stage)s = 'Users' AND %(complete)s),
    -- A complete stage may hand the next one where to start or stop (a replay's fixed users ends).
    plan_cursor = %(next_cursor)s,
    plan_page_no = CASE WHEN %(complete)s THEN 0 ELSE %(next_page_no)s END,
    updated_at = now()
WHERE r.id = %(run_id)s AND r.status = 'Running'
  AND r.plan_page_no = %(page_no)s AND r.plan_cursor IS NOT DISTINCT FROM %(cursor)s
  AND NOT CASE WHEN %(stage)s = 'Tenants' THEN r.tenants_listed ELSE r.users_listed END
  AND (%(stage)s = 'Tenants' OR r.tenants_listed)
RETURNING r.id;

-- name: add_import_pages
INSERT INTO identity.talent_import_pages (id, run_id, stage, page_no, cursor, items_planned)
SELECT gen_random_uuid(), %(run_id)s, %(stage)s, p.page_no, p.cursor, p.planned
FROM unnest(%(page_nos)s::int[], %(cursors)s::text[], %(planned)s::int[]) AS p(page_no, cursor, planned);

-- name: import_page_progress
SELECT stage, status, count(*) AS pages FROM identity.talent_import_pages WHERE run_id = %(run_id)s GROUP BY 1, 2;

-- name: import_page_cursors
SELECT cursor FROM identity.talent_import_pages WHERE run_id = %(run_id)s AND stage = %(stage)s ORDER BY page_no;

-- name: import_stage_times
-- A stage's span in the run's trace: from the listing of its first page to the end of its last.
SELECT min(created_at) AS started_at, max(updated_at) AS ended_at
FROM identity.talent_import_pages WHERE run_id = %(run_id)s AND stage = %(stage)s;

-- name: finish_import_run
UPDATE identity.talent_import_runs
SET status = %(status)s, finished_at = %(now)s, error_code = %(error_code)s, error = %(error)s,
    cancel_requested = cancel_requested OR %(status)s = 'Cancelled', updated_at = now()
WHERE id = %(run_id)s AND status = 'Running'
RETURNING id;

-- name: fail_exhausted_import_pages
-- A page whose attempts are used up (its last holder died, or it kept failing) is Failed, not claimed again.
UPDATE identity.talent_import_pages
SET status = 'Failed', lease_until = NULL, claim_id = NULL, updated_at = %(now)s,
    error = COALESCE(error, 'lease expired after the last attempt')
WHERE attempt_count >= %(max_attempts)s
  AND (status = 'Pending'
       OR (status = 'InProgress' AND (lease_until <= %(now)s OR identity.claim_holder_gone(holder_key))))
  AND run_id IN (SELECT id FROM identity.talent_import_runs WHERE status = 'Running')
RETURNING stage;

-- name: claim_import_page
-- Tenants pages first (the barrier already keeps Users pages out until Tenants are Done); pages others hold
-- are skipped; an InProgress page whose lease expired or whose holder's session is gone is taken again.
WITH next AS (
    SELECT p.id FROM identity.talent_import_pages p
    JOIN identity.talent_import_runs r ON r.id = p.run_id AND r.status = 'Running'
    WHERE (%(run_id)s::uuid IS NULL OR p.run_id = %(run_id)s::uuid)
      AND ((p.status = 'Pending' AND COALESCE(p.available_at, %(now)s) <= %(now)s)
           OR (p.status = 'InProgress' AND (p.lease_until <= %(now)s OR identity.claim_holder_gone(p.holder_key))))
    ORDER BY p.stage = 'Users', p.page_no
    LIMIT 1
    FOR UPDATE OF p SKIP LOCKED
)
UPDATE identity.talent_import_pages p
SET status = 'InProgress', lease_until = %(lease_until)s, claim_id = %(claim_id)s, holder_key = %(holder)s,
    attempt_count = p.attempt_count + 1, updated_at = %(now)s
FROM next
WHERE p.id = next.id
RETURNING p.id, p.run_id, p.stage, p.page_no, p.cursor, p.attempt_count;

-- name: fence_import_page
-- Only the claim holding the lease may complete the page; the row stays locked until the page commits.
UPDATE identity.talent_import_pages
SET lease_until = %(lease_until)s, updated_at = %(now)s
WHERE id = %(page_id)s AND claim_id = %(claim_id)s AND status = 'InProgress'
RETURNING id;

-- name: complete_import_page
WITH page AS (
    UPDATE identity.talent_import_pages
    SET status = 'Done', items_applied = %(applied)s, items_skipped = %(skipped)s, items_failed = %(failed)s,
        items_planned = CASE WHEN %(count_planned)s THEN %(planned)s ELSE items_planned END,
        lease_until = NULL, error = NULL, updated_at = now()
    WHERE id = %(page_id)s AND claim_id = %(claim_id)s AND status = 'InProgress'
    RETURNING run_id, stage
)
UPDATE identity.talent_import_runs r
SET companies_planned = r.companies_planned + CASE WHEN page.stage = 'Tenants' AND %(count_planned)s THEN %(planned)s ELSE 0 END,
    companies_applied = r.companies_applied + CASE WHEN page.stage = 'Tenants' THEN %(applied)s ELSE 0 END,
    companies_skipped = r.companies_skipped + CASE WHEN page.stage = 'Tenants' THEN %(skipped)s ELSE 0 END,
    companies_failed = r.companies_failed + CASE WHEN page.stage = 'Tenants' THEN %(failed)s ELSE 0 END,
    users_planned = r.users_planned + CASE WHEN page.stage = 'Users' AND %(count_planned)s THEN %(planned)s ELSE 0 END,
    users_applied = r.users_applied + CASE WHEN page.stage = 'Users' THEN %(applied)s ELSE 0 END,
    users_skipped = r.users_skipped + CASE WHEN page.stage = 'Users' THEN %(skipped)s ELSE 0 END,
    users_failed = r.users_failed + CASE WHEN page.stage = 'Users' THEN %(failed)s ELSE 0 END,
    updated_at = now()
FROM page
WHERE r.id = page.run_id
RETURNING r.id;

-- name: release_import_page
-- After an infrastructure error: back to Pending with a backoff, or Failed once the attempts are used up.
UPDATE identity.talent_import_pages
SET status = CASE WHEN attempt_count >= %(max_attempts)s THEN 'Failed' ELSE 'Pending' END,
    available_at = %(available_at)s, lease_until = NULL, claim_id = NULL, error = %(error)s, updated_at = %(now)s
WHERE id = %(page_id)s AND claim_id = %(claim_id)s AND status = 'InProgress'
RETURNING status;

-- name: dry_run_states
-- What a dry run would have left of these companies or users (their CompanyState or UserState, as JSON).
SELECT external_id, state FROM identity.talent_import_dry_run_states
WHERE run_id = %(run_id)s AND stage = %(stage)s AND external_id = ANY(%(ids)s::uuid[]);

-- name: dry_run_phones
SELECT phone, external_talent_user_id FROM identity.talent_import_dry_run_phones
WHERE run_id = %(run_id)s AND phone = ANY(%(phones)s::text[]);

-- name: remember_dry_run
WITH states AS (
    INSERT INTO identity.talent_import_dry_run_states (run_id, stage, external_id, state)
    SELECT %(run_id)s, %(stage)s, s.external_id, s.state
    FROM unnest(%(ids)s::uuid[], %(states)s::jsonb[]) AS s(external_id, state)
    ON CONFLICT (run_id, stage, external_id) DO UPDATE SET state = EXCLUDED.state
)
INSERT INTO identity.talent_import_dry_run_phones (run_id, phone, external_talent_user_id)
SELECT %(run_id)s, p.phone, p.talent_user FROM unnest(%(phones)s::text[], %(users)s::uuid[]) AS p(phone, talent_user)
ON CONFLICT DO NOTHING;

-- name: talent_users_of_tenant
SELECT u.external_talent_user_id FROM identity.users u
JOIN identity.companies c ON c.id = u.company_id
WHERE c.external_talent_tenant_id = %(tenant_id)s AND u.external_talent_user_id = ANY(%(user_ids)s::uuid[]);

-- name: import_lock_holder
-- Who holds the one-run lock: the session's process, application name and client.
SELECT a.pid, a.application_name, COALESCE(host(a.client_addr), 'local') AS client, a.backend_start
FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
  AND ((l.classid::bigint << 32) | l.objid::bigint) = hashtextextended(%(key)s, 0);

-- name: try_import_lock
SELECT pg_try_advisory_lock(hashtextextended(%(key)s, 0));

-- name: release_import_lock
SELECT pg_advisory_unlock(hashtextextended(%(key)s, 0));

-- name: reset_import_leases
-- The holder is taken for dead: its attempt is given back, so a page on its last attempt is retried, not Failed.
UPDATE identity.talent_import_pages
SET lease_until = now(), attempt_count = GREATEST(attempt_count - 1, 0), updated_at = now()
WHERE run_id = %(run_id)s AND status = 'InProgress'
RETURNING id;

-- name: request_import_cancel
UPDATE identity.talent_import_runs
SET status = 'Cancelled', cancel_requested = true, finished_at = now(), updated_at = now()
WHERE id = %(run_id)s AND status = 'Running'
RETURNING id;

-- ---------------------------------------------------------------- retention (maintenance prune)

-- name: prune_fanout_tasks
-- Completed tasks only: a Failed one is the only record that users past its cursor never got their event,
-- and stays until an operator replays or discards it (docs/runbooks.md, "Retention").
DELETE FROM identity.access_fanout_tasks
WHERE status = 'Completed' AND COALESCE(completed_at, updated_at) < %(cutoff)s
RETURNING id;

-- name: prune_import_runs
-- Pages, dry-run memory and the run's quarantine go with the run (ON DELETE CASCADE).
DELETE FROM identity.talent_import_runs
WHERE status <> 'Running' AND COALESCE(finished_at, updated_at) < %(cutoff)s
RETURNING id;

-- name: prune_quarantine_payloads
-- The snapshot a row keeps is PII: past retention only the row's id, codes and Talent id remain. Items the
-- consumer still retries keep theirs.
UPDATE identity.talent_import_failed_items
SET payload = NULL, updated_at = now()
WHERE payload IS NOT NULL AND created_at < %(cutoff)s AND next_attempt_at IS NULL
RETURNING id;

-- ---------------------------------------------------------------- operator console (admin reads)

-- name: recent_import_runs
-- The newest runs first, with their counters and quarantine size; a run's pages and ETA come with the run.
SELECT r.id AS run_id, r.mode, r.status, r.dry_run, r.talent_tenant_id_filter AS tenant_filter,
       r.page_size, r.companies_planned, r.companies_applied, r.companies_skipped, r.companies_failed,
       r.users_planned, r.users_applied, r.users_skipped, r.users_failed,
       r.started_at, r.finished_at, r.error_code,
       (SELECT count(*) FROM identity.talent_import_failed_items f WHERE f.run_id = r.id) AS quarantined
FROM identity.talent_import_runs r
ORDER BY r.started_at DESC, r.id
LIMIT %(limit)s;

-- name: admin_roles
-- One role by id, or roles by code, or the first `limit` (system roles first): each with its permissions and
-- its size as the fan-out counts it (distinct users holding an Active assignment, count_active_users).
SELECT rd.id AS role_id, rd.code, rd.name, rd.company_id, c.name AS company_name, rd.status, rd.version,
       ARRAY(SELECT rp.permission_code FROM identity.role_permissions rp WHERE rp.role_id = rd.id ORDER BY 1)
           AS permissions,
       (SELECT count(DISTINCT ra.user_id) FROM identity.role_assignments ra
        WHERE ra.role_id = rd.id AND ra.status = 'Active') AS holders
FROM identity.role_definitions rd
LEFT JOIN identity.companies c ON c.id = rd.company_id
WHERE (%(role_id)s::uuid IS NULL OR rd.id = %(role_id)s::uuid)
  AND (%(code)s::text IS NULL OR rd.code = %(code)s::text)
ORDER BY rd.company_id NULLS FIRST, rd.code, rd.id
LIMIT %(limit)s;

-- name: outbox_dead_letter_summary
SELECT count(*) AS count, max(failed_at) AS newest_failed_at FROM identity.outbox_dead_letters;

-- ---------------------------------------------------------------- grants

-- name: missing_privileges
-- Which of the privileges a job's grants name (a relation, a privilege, its column if any, whether the
-- relation is a sequence) the connected role does not hold; a relation not created yet counts as held.
SELECT current_user AS role, g.relation,
       g.privilege || COALESCE(' (' || g.column_name || ')', '') AS privilege
FROM unnest(%(relations)s::text[], %(privileges)s::text[], %(columns)s::text[], %(sequences)s::bool[])
    AS g(relation, privilege, column_name, is_sequence)
WHERE to_regclass(g.relation) IS NOT NULL
  AND NOT CASE
      WHEN g.is_sequence THEN has_sequence_privilege(g.relation, g.privilege)
      WHEN g.column_name IS NOT NULL THEN has_column_privilege(g.relation, g.column_name, g.privilege)
      ELSE has_table_privilege(g.relation, g.privilege)
  END;
