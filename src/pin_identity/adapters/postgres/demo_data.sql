-- The demo's check of the bootstrap (demo_data.py); its progress reads are the stores' own
-- (fanout_task_status, outbox_is_empty, count_active_users). Parameters use psycopg's %(name)s style.

-- name: talent_managers_with_one_default_role
-- The demo's check of the bootstrap: every Talent manager holds exactly one Active default role.
SELECT count(*) FROM identity.users u
WHERE u.sync_source = 'TalentIdentity' AND u.status <> 'Blocked'
  AND (SELECT count(*) FROM identity.role_assignments ra
       JOIN identity.role_definitions rd ON rd.id = ra.role_id AND rd.code = %(code)s
       WHERE ra.user_id = u.id AND ra.status = 'Active'
         AND ra.scope_type = 'Organization' AND ra.scope_organization_id = u.company_id) = 1;
