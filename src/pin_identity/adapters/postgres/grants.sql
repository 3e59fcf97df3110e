-- A job's check of its grants as it starts (grants.py). Parameters use psycopg's %(name)s style.

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
