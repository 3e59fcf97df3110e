-- A user's access as UserAccessChanged carries it, read by several stores: the fan-out's page write includes
-- rendered_access_snapshots, the replica's apply reads it with user_access_versions, the access audit and
-- `access show` read it, and a point change reads the version. Parameters use psycopg's %(name)s style.

-- name: user_access_versions
SELECT user_id, max(version) AS version FROM identity.role_assignments
WHERE user_id = ANY(%(user_ids)s::uuid[]) GROUP BY user_id;

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
