"""The quarantine keeps what was wrong with an item in words (CONTRACTS section 3), never the value itself.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30
"""

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE identity.talent_import_failed_items ADD COLUMN reason text NULL")


def downgrade() -> None:
    raise NotImplementedError("pin-identity migrations move forward only")
