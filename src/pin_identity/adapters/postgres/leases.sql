-- The lease rules' conditions, written once for the two queues that lease rows: fan-out tasks
-- (fanout_queue.sql) and import pages (import_store.sql). pin_identity.domain.lease states the rules and
-- computes the values the queues write; here is what their statements test. Each include names the queue's
-- own columns: {status}; {lease_until}, the lease's end (a fan-out task's lease_expires_at); {owner}, the
-- claim's id that fences the lease (lease_owner, claim_id); {holder_key}; {available_at}, when a released row
-- may be claimed again (NULL for a fan-out task, which waits out its back-off InProgress until its lease's
-- end, without an owner). Parameters: %(now)s, passed in (no rule reads the server's clock), %(claim_id)s,
-- %(max_attempts)s.

-- name: lease_available
-- A row that waits to be claimed and may be now.
{status} = 'Pending' AND COALESCE({available_at}, %(now)s) <= %(now)s

-- name: lease_over
-- A claimed row whose lease is over: run out at `now`, or held by an owner whose holder session is gone
-- (migration 0009), taken over at once. A released row with no owner waits for its lease's end.
{status} = 'InProgress'
AND ({lease_until} <= %(now)s OR ({owner} IS NOT NULL AND identity.claim_holder_gone({holder_key})))

-- name: lease_still_mine
-- The fence: the row is still this claim's. A lease that ran out but that no other claim took over is still
-- its owner's (a takeover rewrites the owner); the statement that tests this locks the row to its
-- transaction's end, so a claim skips it meanwhile.
{owner} = %(claim_id)s AND {status} = 'InProgress'

-- name: lease_spent
-- A row that may not be claimed again: its attempts are used up.
attempt_count >= %(max_attempts)s
