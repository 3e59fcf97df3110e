-- A claim holder's session (holder_session.py). Parameters use psycopg's %(name)s style.

-- name: take_holder_lock
-- A claim holder's lock (adapters/postgres/holder_session.py), held for as long as its session lives.
SELECT pg_try_advisory_lock(%(space)s, %(key)s);
