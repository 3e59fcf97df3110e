"""Quarantine rows remember their attempts (the consumer retries a user whose tenant has not arrived yet), and
deletions of entities the replica never had are remembered by version.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

QUARANTINE_RETRIES = """
ALTER TABLE identity.talent_import_failed_items
    ADD COLUMN attempt_count integer NOT NULL DEFAULT 1 CHECK (attempt_count >= 1),
    ADD COLUMN next_attempt_at timestamptz NULL,
    ADD COLUMN updated_at timestamptz NOT NULL DEFAULT now();
CREATE INDEX ix_talent_import_failed_items_due ON identity.talent_import_failed_items (next_attempt_at)
    WHERE next_attempt_at IS NOT NULL;
CREATE INDEX ix_talent_import_failed_items_external_id ON identity.talent_import_failed_items (external_id);

-- A Talent entity deleted (with a version) while the replica did not have it: its version guard, so that an
-- older snapshot arriving later is skipped instead of creating it. Ids and versions only, no PII.
CREATE TABLE identity.talent_deletions (
    stage text NOT NULL CHECK (stage IN ('Tenants', 'Users')),
    external_id uuid NOT NULL,
    version bigint NOT NULL CHECK (version >= 1),
    deleted_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (stage, external_id)
);
"""


def upgrade() -> None:
    op.execute(QUARANTINE_RETRIES)


def downgrade() -> None:
    raise NotImplementedError("pin-identity migrations move forward only")
