"""Initial schema: identity aggregates, fan-out queue, Talent import state, transactional outbox.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

# A fixed id, so that every environment (and every test) knows the system role without a lookup.
DEVELOPER_MANAGER_ROLE_ID = "00000000-0000-4000-8000-000000000001"
NIL_UUID = "'00000000-0000-0000-0000-000000000000'::uuid"

AGGREGATES = f"""
CREATE TABLE identity.companies (
    id uuid PRIMARY KEY,
    name text NOT NULL,
    company_type text NOT NULL CHECK (company_type IN ('Developer', 'Agency', 'Bank')),
    status text NOT NULL CHECK (status IN ('Pending', 'Active', 'Blocked')),
    tax_id text NULL,
    sync_source text NOT NULL DEFAULT 'Local' CHECK (sync_source IN ('Local', 'TalentIdentity')),
    external_talent_tenant_id uuid NULL UNIQUE,
    replica_version bigint NULL CHECK (replica_version >= 1),
    last_synced_at timestamptz NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- INV-4: a company's type never changes once set.
CREATE FUNCTION identity.forbid_company_type_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.company_type IS DISTINCT FROM OLD.company_type THEN
        RAISE EXCEPTION 'company_type of company % is immutable (INV-4)', OLD.id
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER companies_type_immutable BEFORE UPDATE OF company_type ON identity.companies
    FOR EACH ROW EXECUTE FUNCTION identity.forbid_company_type_change();

CREATE TABLE identity.users (
    id uuid PRIMARY KEY,
    company_id uuid NULL REFERENCES identity.companies (id),
    type text NOT NULL CHECK (type IN ('Investor', 'DeveloperManager', 'PlatformAdmin')),
    status text NOT NULL CHECK (status IN ('Invited', 'Active', 'Blocked')),
    phone text NOT NULL UNIQUE CHECK (phone ~ '^\\+[1-9][0-9]{{6,14}}$'),
    email text NULL,
    first_name text NOT NULL,
    last_name text NOT NULL,
    middle_name text NULL,
    contacts_managed_by text NOT NULL DEFAULT 'User' CHECK (contacts_managed_by IN ('User', 'TalentSync')),
    sync_source text NOT NULL DEFAULT 'Local' CHECK (sync_source IN ('Local', 'TalentIdentity')),
    external_talent_user_id uuid NULL UNIQUE,
    replica_version bigint NULL CHECK (replica_version >= 1),
    last_synced_at timestamptz NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX ix_users_company_id ON identity.users (company_id);

CREATE TABLE identity.role_definitions (
    id uuid PRIMARY KEY,
    code text NOT NULL,
    name text NOT NULL,
    company_id uuid NULL REFERENCES identity.companies (id),
    status text NOT NULL DEFAULT 'Active' CHECK (status IN ('Active', 'Archived')),
    version bigint NOT NULL DEFAULT 1 CHECK (version >= 1),
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT uq_role_definitions_company_code UNIQUE (company_id, code)
);
-- UNIQUE (company_id, code) treats NULLs as distinct, so system roles need their own index.
CREATE UNIQUE INDEX uq_role_definitions_system_code ON identity.role_definitions (code)
    WHERE company_id IS NULL;

CREATE TABLE identity.role_permissions (
    role_id uuid NOT NULL REFERENCES identity.role_definitions (id) ON DELETE CASCADE,
    permission_code text NOT NULL,
    PRIMARY KEY (role_id, permission_code)
);

CREATE TABLE identity.role_assignments (
    id uuid PRIMARY KEY,
    role_id uuid NOT NULL REFERENCES identity.role_definitions (id),
    user_id uuid NOT NULL REFERENCES identity.users (id),
    company_id uuid NULL REFERENCES identity.companies (id),
    scope_type text NOT NULL CHECK (scope_type IN ('Platform', 'Organization', 'ProjectGroup', 'Project')),
    scope_organization_id uuid NULL,
    scope_project_group_id uuid NULL,
    scope_project_id uuid NULL,
    status text NOT NULL DEFAULT 'Active' CHECK (status IN ('Active', 'Revoked', 'Expired')),
    expires_at timestamptz NULL,
    version bigint NOT NULL DEFAULT 1 CHECK (version >= 1),
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT ck_role_assignments_scope CHECK (
        (scope_type = 'Platform') OR
        (scope_type = 'Organization' AND scope_organization_id IS NOT NULL) OR
        (scope_type = 'ProjectGroup' AND scope_project_group_id IS NOT NULL) OR
        (scope_type = 'Project' AND scope_project_id IS NOT NULL)
    )
);
-- Keyset pages of a role's users: (role_id, user_id) over Active rows only.
CREATE INDEX ix_role_assignments_role_active_user ON identity.role_assignments (role_id, user_id)
    WHERE status = 'Active';
-- Snapshots: every Active assignment of a set of users.
CREATE INDEX ix_role_assignments_user_active ON identity.role_assignments (user_id)
    WHERE status = 'Active';
CREATE INDEX ix_role_assignments_user_id ON identity.role_assignments (user_id);
-- The same grant cannot be Active twice (it keeps a created user's default role unique under races).
CREATE UNIQUE INDEX uq_role_assignments_active_grant ON identity.role_assignments (
    role_id, user_id, scope_type,
    COALESCE(scope_organization_id, {NIL_UUID}),
    COALESCE(scope_project_group_id, {NIL_UUID}),
    COALESCE(scope_project_id, {NIL_UUID})
) WHERE status = 'Active';

INSERT INTO identity.role_definitions (id, code, name, company_id, status, version)
VALUES ('{DEVELOPER_MANAGER_ROLE_ID}', 'developer-manager', 'Developer manager', NULL, 'Active', 1);
"""

FANOUT_QUEUE = """
CREATE TABLE identity.access_fanout_tasks (
    id uuid PRIMARY KEY,
    role_id uuid NOT NULL REFERENCES identity.role_definitions (id) ON DELETE RESTRICT,
    company_id uuid NULL,
    role_version bigint NOT NULL CHECK (role_version >= 1),
    reason text NOT NULL DEFAULT 'RolePermissionsChanged' CHECK (reason IN
        ('RoleAssigned', 'RoleRevoked', 'RoleExpired', 'RolePermissionsChanged', 'RoleArchived')),
    status text NOT NULL DEFAULT 'Pending' CHECK (status IN ('Pending', 'InProgress', 'Completed', 'Failed')),
    cursor uuid NULL,
    processed_count integer NOT NULL DEFAULT 0 CHECK (processed_count >= 0),
    attempt_count integer NOT NULL DEFAULT 0 CHECK (attempt_count >= 0),
    lease_expires_at timestamptz NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    started_at timestamptz NULL,
    completed_at timestamptz NULL,
    updated_at timestamptz NOT NULL DEFAULT now(),
    -- Beyond the spec: the claim that holds the lease (fencing token) and the last error seen.
    lease_owner uuid NULL,
    last_error text NULL
);
CREATE INDEX ix_access_fanout_tasks_role_id ON identity.access_fanout_tasks (role_id);
CREATE INDEX ix_access_fanout_tasks_company_id ON identity.access_fanout_tasks (company_id);
CREATE INDEX ix_access_fanout_tasks_pending ON identity.access_fanout_tasks (created_at)
    WHERE status IN ('Pending', 'InProgress');
CREATE INDEX ix_access_fanout_tasks_failed ON identity.access_fanout_tasks (created_at)
    WHERE status = 'Failed';
-- Coalescing: at most one Pending task per role; a newer permission change raises its role_version.
CREATE UNIQUE INDEX uq_access_fanout_tasks_pending_role ON identity.access_fanout_tasks (role_id)
    WHERE status = 'Pending';
"""

TALENT_IMPORT = """
CREATE TABLE identity.talent_import_runs (
    id uuid PRIMARY KEY,
    mode text NOT NULL CHECK (mode IN ('ApiPull', 'TopicReplay')),
    status text NOT NULL DEFAULT 'Running' CHECK (status IN ('Running', 'Completed', 'Failed', 'Cancelled')),
    talent_tenant_id_filter uuid NULL,
    page_size integer NOT NULL DEFAULT 500 CHECK (page_size BETWEEN 1 AND 2000),
    dry_run boolean NOT NULL DEFAULT false,
    correlation_id uuid NOT NULL,
    started_at timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz NULL,
    companies_planned integer NOT NULL DEFAULT 0,
    companies_applied integer NOT NULL DEFAULT 0,
    companies_skipped integer NOT NULL DEFAULT 0,
    companies_failed integer NOT NULL DEFAULT 0,
    users_planned integer NOT NULL DEFAULT 0,
    users_applied integer NOT NULL DEFAULT 0,
    users_skipped integer NOT NULL DEFAULT 0,
    users_failed integer NOT NULL DEFAULT 0,
    cancel_requested boolean NOT NULL DEFAULT false,
    error text NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
);
-- Together with the advisory lock: never two Running runs.
CREATE UNIQUE INDEX uq_talent_import_runs_running ON identity.talent_import_runs ((true))
    WHERE status = 'Running';

CREATE TABLE identity.talent_import_pages (
    id uuid PRIMARY KEY,
    run_id uuid NOT NULL REFERENCES identity.talent_import_runs (id) ON DELETE CASCADE,
    stage text NOT NULL CHECK (stage IN ('Tenants', 'Users')),
    page_no integer NOT NULL CHECK (page_no >= 0),
    cursor text NULL,
    status text NOT NULL DEFAULT 'Pending' CHECK (status IN ('Pending', 'InProgress', 'Done', 'Failed')),
    lease_until timestamptz NULL,
    items_applied integer NOT NULL DEFAULT 0,
    items_failed integer NOT NULL DEFAULT 0,
    attempt_count integer NOT NULL DEFAULT 0,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT uq_talent_import_pages_run_stage_page UNIQUE (run_id, stage, page_no)
);
CREATE INDEX ix_talent_import_pages_claimable ON identity.talent_import_pages (run_id, stage, page_no)
    WHERE status IN ('Pending', 'InProgress');

CREATE TABLE identity.talent_import_failed_items (
    id uuid PRIMARY KEY,
    run_id uuid NULL REFERENCES identity.talent_import_runs (id) ON DELETE CASCADE,
    stage text NOT NULL CHECK (stage IN ('Tenants', 'Users')),
    external_id uuid NULL,
    error_code text NOT NULL,
    payload jsonb NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX ix_talent_import_failed_items_run_id ON identity.talent_import_failed_items (run_id);
"""

OUTBOX = """
CREATE TABLE identity.outbox_events (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- The writing transaction: the relay publishes only rows of transactions older than every
    -- transaction still running, so a row that commits late is never overtaken (the outbox gap).
    tx_id xid8 NOT NULL DEFAULT pg_current_xact_id(),
    event_id uuid NOT NULL,
    topic text NOT NULL,
    message_key text NOT NULL,
    event_type text NOT NULL,
    correlation_id uuid NOT NULL,
    traceparent text NULL,
    value text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE identity.outbox_dead_letters (
    id bigint PRIMARY KEY,
    event_id uuid NOT NULL,
    topic text NOT NULL,
    message_key text NOT NULL,
    event_type text NOT NULL,
    correlation_id uuid NOT NULL,
    traceparent text NULL,
    value text NOT NULL,
    error text NOT NULL,
    created_at timestamptz NOT NULL,
    failed_at timestamptz NOT NULL DEFAULT now()
);
"""


def upgrade() -> None:
    for block in (AGGREGATES, FANOUT_QUEUE, TALENT_IMPORT, OUTBOX):
        op.execute(block)


def downgrade() -> None:
    raise NotImplementedError("pin-identity migrations move forward only")
