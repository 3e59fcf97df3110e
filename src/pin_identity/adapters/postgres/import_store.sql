-- The initial import's statements (import_store.py): its runs and their leased pages, the dry run's memory,
-- the one-run lock. Parameters use psycopg's %(name)s style.

-- name: import_failed_items
-- A run's quarantine, or the continuous consumer's (run_id null).
SELECT id AS item_id, stage, external_id, error_code, reason, attempt_count AS attempts, created_at, updated_at
FROM identity.talent_import_failed_items
WHERE run_id IS NOT DISTINCT FROM %(run_id)s::uuid
ORDER BY created_at, id;

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
-- A page whose attempts are used up (its last holder died, or it kept failing) and that no one holds (it waits,
-- available yet or not, or its lease is over) is Failed, not claimed again.
UPDATE identity.talent_import_pages
SET status = 'Failed', lease_until = NULL, claim_id = NULL, updated_at = %(now)s,
    error = COALESCE(error, 'lease expired after the last attempt')
WHERE (
-- include: lease_spent
) AND (status = 'Pending' OR (
-- include: lease_over (status = status, lease_until = lease_until, owner = claim_id, holder_key = holder_key)
))
  AND run_id IN (SELECT id FROM identity.talent_import_runs WHERE status = 'Running')
RETURNING stage;

-- name: claim_import_page
-- Tenants pages first (the barrier already keeps Users pages out until Tenants are Done); pages others hold
-- are skipped; an InProgress page whose lease expired or whose holder's session is gone is taken again.
WITH next AS (
    SELECT p.id FROM identity.talent_import_pages p
    JOIN identity.talent_import_runs r ON r.id = p.run_id AND r.status = 'Running'
    WHERE (%(run_id)s::uuid IS NULL OR p.run_id = %(run_id)s::uuid)
      AND ((
-- include: lease_available (status = p.status, available_at = p.available_at)
      ) OR (
-- include: lease_over (status = p.status, lease_until = p.lease_until, owner = p.claim_id, holder_key = p.holder_key)
      ))
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

-- name: renew_import_page_lease
-- Fencing: only the claim holding the lease may complete the page; the row stays locked until the page commits.
UPDATE identity.talent_import_pages
SET lease_until = %(lease_until)s, updated_at = %(now)s
WHERE id = %(page_id)s AND (
-- include: lease_still_mine (owner = claim_id, status = status)
)
RETURNING id;

-- name: complete_import_page
WITH page AS (
    UPDATE identity.talent_import_pages
    SET status = 'Done', items_applied = %(applied)s, items_skipped = %(skipped)s, items_failed = %(failed)s,
        items_planned = CASE WHEN %(count_planned)s THEN %(planned)s ELSE items_planned END,
        lease_until = NULL, error = NULL, updated_at = %(now)s
    WHERE id = %(page_id)s AND (
-- include: lease_still_mine (owner = claim_id, status = status)
    )
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
    updated_at = %(now)s
FROM page
WHERE r.id = page.run_id
RETURNING r.id;

-- name: release_import_page
-- After an infrastructure error: back to Pending with a backoff, or Failed once the attempts are used up (a
-- release that does not count gives the attempt back, and the page is never Failed by it).
UPDATE identity.talent_import_pages
SET status = CASE WHEN %(count_attempt)s AND (
-- include: lease_spent
    ) THEN 'Failed' ELSE 'Pending' END,
    attempt_count = CASE WHEN %(count_attempt)s THEN attempt_count ELSE GREATEST(attempt_count - 1, 0) END,
    available_at = %(available_at)s, lease_until = NULL, claim_id = NULL, error = COALESCE(%(error)s, error),
    updated_at = %(now)s
WHERE id = %(page_id)s AND (
-- include: lease_still_mine (owner = claim_id, status = status)
)
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
-- Its lease ends at the operator's `now`, so a claim at that time or later takes the page.
UPDATE identity.talent_import_pages
SET lease_until = %(now)s, attempt_count = GREATEST(attempt_count - 1, 0), updated_at = %(now)s
WHERE run_id = %(run_id)s AND status = 'InProgress'
RETURNING id;

-- name: request_import_cancel
UPDATE identity.talent_import_runs
SET status = 'Cancelled', cancel_requested = true, finished_at = now(), updated_at = now()
WHERE id = %(run_id)s AND status = 'Running'
RETURNING id;
