-- `maintenance prune` (retention.py). Parameters use psycopg's %(name)s style.

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
