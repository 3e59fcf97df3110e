"""A claim names its holder's session: `holder_key` on fan-out tasks and import pages is the key of the
session-level advisory lock the claiming process holds for as long as its database session lives. A claim
whose holder's lock is gone (the process killed, its host lost and its session ended) is taken over at once,
not at lease expiry; a live holder keeps the lease rules (`identity.claim_holder_gone`, used by every
statement that decides whether a claim may be taken).

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-05
"""

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

# The lock's first key: the space of holder locks (pg_advisory_lock(int, int): objsubid 2 in pg_locks), apart
# from the relay's and the import run's single-key locks. As in adapters/postgres/holder_session.py.
HOLDER_LOCK_SPACE = 1_885_957_632

CLAIM_HOLDERS = f"""
ALTER TABLE identity.access_fanout_tasks ADD COLUMN holder_key bigint;
ALTER TABLE identity.talent_import_pages ADD COLUMN holder_key bigint;
CREATE FUNCTION identity.claim_holder_gone(holder bigint) RETURNS boolean
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT holder IS NOT NULL AND NOT EXISTS (
        SELECT 1 FROM pg_catalog.pg_locks l
        WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
          AND l.database = (SELECT oid FROM pg_catalog.pg_database WHERE datname = current_database())
          AND l.classid = {HOLDER_LOCK_SPACE}::bigint::oid AND l.objid = holder::oid)
$$;
"""


def upgrade() -> None:
    op.execute(CLAIM_HOLDERS)


def downgrade() -> None:
    raise NotImplementedError("pin-identity migrations move forward only")
