"""A dead letter's identity is its own: `outbox_dead_letters.id` stays the outbox id the event had (what an
operator looks it up by), no longer the key. After `TRUNCATE identity.outbox_events RESTART IDENTITY` the
outbox hands out its ids again, and a rejected row with a recycled id failed to enter the dead letters at
every try: its batch was rolled back each time and nothing behind it ever committed.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-05
"""

from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

DEAD_LETTER_IDENTITY = """
ALTER TABLE identity.outbox_dead_letters DROP CONSTRAINT outbox_dead_letters_pkey;
ALTER TABLE identity.outbox_dead_letters
    ADD COLUMN dead_letter_id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY;
CREATE INDEX ix_outbox_dead_letters_id ON identity.outbox_dead_letters (id);
"""


def upgrade() -> None:
    op.execute(DEAD_LETTER_IDENTITY)


def downgrade() -> None:
    raise NotImplementedError("pin-identity migrations move forward only")
