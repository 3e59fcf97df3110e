"""A dry run remembers the companies and users it would have written as they would be, not only which
tenants it would have created: its later pages then decide against what a real run's would find (a repeated
snapshot is skipped, a later deletion blocks what an earlier page would have created), so its counts are the
real run's.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-05
"""

from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

DRY_RUN_STATES = """
-- Kept with the run, deleted with it (maintenance prune): a user's state holds its phone and names (PII).
CREATE TABLE identity.talent_import_dry_run_states (
    run_id uuid NOT NULL REFERENCES identity.talent_import_runs (id) ON DELETE CASCADE,
    stage text NOT NULL CHECK (stage IN ('Tenants', 'Users')),
    external_id uuid NOT NULL,
    state jsonb NOT NULL,
    PRIMARY KEY (run_id, stage, external_id)
);
-- Which companies a dry run would have created is now in its states.
DROP TABLE identity.talent_import_dry_run_tenants;
"""


def upgrade() -> None:
    op.execute(DRY_RUN_STATES)


def downgrade() -> None:
    raise NotImplementedError("pin-identity migrations move forward only")
