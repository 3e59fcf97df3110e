"""Whether the last active outbox relay stood down cleanly (its producer discarded before its lock went).

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30
"""

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

RELAY_HANDOVER = """
CREATE TABLE identity.outbox_relay_handover (
    id smallint PRIMARY KEY DEFAULT 1 CHECK (id = 1),
    -- host:pid:instance of the relay that last took the lock
    holder text NULL,
    -- false from the moment a relay takes the lock until it says nothing it handed to its producer can still
    -- reach the broker; a relay taking over from one that never said so waits a grace period first
    clean boolean NOT NULL DEFAULT true,
    updated_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO identity.outbox_relay_handover DEFAULT VALUES;
"""


def upgrade() -> None:
    op.execute(RELAY_HANDOVER)


def downgrade() -> None:
    raise NotImplementedError("pin-identity migrations move forward only")
