-- The identity transaction's statements (identity_store.py): companies, users, roles and their assignments,
-- and the fan-out task a role change leaves. Parameters use psycopg's %(name)s style.

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

-- ---------------------------------------------------------------- a role change's fan-out task

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
