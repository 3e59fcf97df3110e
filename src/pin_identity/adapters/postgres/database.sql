-- The pool's check of a connection (database.py), with which a session of its own (the relay's, a claim
-- holder's) checks itself too.

-- name: ping
SELECT 1;
