-- What the operator console reads beside the stores' own reads (admin_reads.py). Parameters use psycopg's
-- %(name)s style.

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
