-- The Talent replica's statements (replica_store.py): its companies and users, their default role, and the
-- quarantine of what could not be applied yet. Parameters use psycopg's %(name)s style.

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

-- name: import_failed_items_for_replay
SELECT id, stage, external_id, error_code, payload, attempt_count, next_attempt_at
FROM identity.talent_import_failed_items
WHERE run_id IS NOT DISTINCT FROM %(run_id)s::uuid AND (%(all)s OR id = ANY(%(ids)s::uuid[]))
ORDER BY created_at, id
FOR UPDATE SKIP LOCKED;
