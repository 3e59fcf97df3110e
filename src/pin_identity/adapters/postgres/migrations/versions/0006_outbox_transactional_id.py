"""The outbox's transactional id: one fixed Kafka `transactional.id` per outbox, so that a relay that takes
over fences every producer of the relays before it at the broker.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01
"""

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

TRANSACTIONAL_ID = """
ALTER TABLE identity.outbox_relay_handover
    ADD COLUMN transactional_id text NOT NULL DEFAULT ('pin-identity-outbox-relay-' || gen_random_uuid());
"""


def upgrade() -> None:
    op.execute(TRANSACTIONAL_ID)


def downgrade() -> None:
    raise NotImplementedError("pin-identity migrations move forward only")
