"""What the initial import needs to plan, lease and resume its pages, and to count a dry run.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29
"""

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

IMPORT_ORCHESTRATION = """
ALTER TABLE identity.talent_import_runs
    -- Where planning stands, so that a resumed run continues the listing instead of starting it again.
    ADD COLUMN tenants_listed boolean NOT NULL DEFAULT false,
    ADD COLUMN users_listed boolean NOT NULL DEFAULT false,
    ADD COLUMN plan_cursor text NULL,
    ADD COLUMN plan_page_no integer NOT NULL DEFAULT 0,
    ADD COLUMN error_code text NULL;

ALTER TABLE identity.talent_import_pages
    ADD COLUMN items_planned integer NOT NULL DEFAULT 0,
    ADD COLUMN items_skipped integer NOT NULL DEFAULT 0,
    -- Fencing: only the claim that holds the lease may complete the page.
    ADD COLUMN claim_id uuid NULL,
    -- Backoff after an infrastructure error: the page is not claimable before this moment.
    ADD COLUMN available_at timestamptz NULL,
    ADD COLUMN error text NULL;

-- A dry run writes no replica rows; its later pages resolve tenants and phone owners against the replica
-- plus what the run would have written (kept with the run, deleted with it: the phones are PII).
CREATE TABLE identity.talent_import_dry_run_tenants (
    run_id uuid NOT NULL REFERENCES identity.talent_import_runs (id) ON DELETE CASCADE,
    external_talent_tenant_id uuid NOT NULL,
    PRIMARY KEY (run_id, external_talent_tenant_id)
);
CREATE TABLE identity.talent_import_dry_run_phones (
    run_id uuid NOT NULL REFERENCES identity.talent_import_runs (id) ON DELETE CASCADE,
    phone text NOT NULL,
    external_talent_user_id uuid NOT NULL,
    PRIMARY KEY (run_id, phone)
);
"""


def upgrade() -> None:
    op.execute(IMPORT_ORCHESTRATION)


def downgrade() -> None:
    raise NotImplementedError("pin-identity migrations move forward only")
