"""Migrations on an empty database: upgrade, a second no-op upgrade, and several pods upgrading at once."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import psycopg
import pytest

from pin_identity.adapters.postgres import migrate
from tests.support.databases import scratch_database

TABLES = {
    "outbox_relay_handover",
    "companies",
    "users",
    "role_definitions",
    "role_permissions",
    "role_assignments",
    "access_fanout_tasks",
    "talent_import_runs",
    "talent_import_pages",
    "talent_import_failed_items",
    "talent_import_dry_run_states",
    "talent_import_dry_run_phones",
    "talent_deletions",
    "outbox_events",
    "outbox_dead_letters",
    "alembic_version",
}


@pytest.fixture
def empty_database(postgres_admin_url: str, request: pytest.FixtureRequest) -> Iterator[str]:
    name = f"empty_{request.node.name}".lower()[:60].replace("[", "_").replace("]", "")
    with scratch_database(postgres_admin_url, name, template=None) as url:
        yield url


def _schema_fingerprint(url: str) -> list[tuple[str, ...]]:
    with psycopg.connect(url) as conn:
        return conn.execute(
            "SELECT table_name, column_name, data_type, is_nullable FROM information_schema.columns"
            " WHERE table_schema = 'identity' ORDER BY 1, 2"
        ).fetchall()


def test_upgrade_creates_every_table_and_the_system_role(empty_database: str) -> None:
    assert migrate.current_revision(empty_database) is None
    migrate.upgrade(empty_database)
    with psycopg.connect(empty_database) as conn:
        tables = {
            row[0]
            for row in conn.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = 'identity'"
            )
        }
        role = conn.execute(
            "SELECT code, company_id, status, version FROM identity.role_definitions"
            " WHERE code = 'developer-manager'"
        ).fetchall()
        indexes = {
            row[0] for row in conn.execute("SELECT indexname FROM pg_indexes WHERE schemaname = 'identity'")
        }
    assert tables == TABLES
    assert role == [("developer-manager", None, "Active", 1)]
    assert {"ix_access_fanout_tasks_role_id", "ix_access_fanout_tasks_pending"} <= indexes
    assert migrate.current_revision(empty_database) == migrate.head_revision()


def test_second_upgrade_is_a_no_op(empty_database: str) -> None:
    migrate.upgrade(empty_database)
    before = _schema_fingerprint(empty_database)
    migrate.upgrade(empty_database)
    assert _schema_fingerprint(empty_database) == before
    with psycopg.connect(empty_database) as conn:
        assert conn.execute("SELECT count(*) FROM identity.role_definitions").fetchone() == (1,)


def test_pods_upgrading_at_once_serialise_on_the_lock(empty_database: str) -> None:
    code = "import sys; from pin_identity.adapters.postgres import migrate; migrate.upgrade(sys.argv[1])"
    pods = [
        subprocess.Popen([sys.executable, "-c", code, empty_database], stderr=subprocess.PIPE)
        for _ in range(4)
    ]
    results = [(pod.wait(timeout=60), pod.stderr.read().decode() if pod.stderr else "") for pod in pods]
    assert [rc for rc, _ in results] == [0, 0, 0, 0], results
    assert migrate.current_revision(empty_database) == migrate.head_revision()


def test_schema_enforces_the_contract_invariants(empty_database: str) -> None:
    migrate.upgrade(empty_database)
    with psycopg.connect(empty_database, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO identity.companies (id, name, company_type, status)"
            " VALUES ('00000000-0000-4000-8000-0000000000c1', 'A', 'Developer', 'Active')"
        )
        with pytest.raises(psycopg.errors.CheckViolation):  # INV-4
            conn.execute("UPDATE identity.companies SET company_type = 'Bank'")
        with pytest.raises(psycopg.errors.CheckViolation):
            conn.execute(
                "INSERT INTO identity.companies (id, name, company_type, status)"
                " VALUES ('00000000-0000-4000-8000-0000000000c2', 'B', 'Shop', 'Active')"
            )
        with pytest.raises(psycopg.errors.UniqueViolation):  # system roles unique by code
            conn.execute(
                "INSERT INTO identity.role_definitions (id, code, name)"
                " VALUES ('00000000-0000-4000-8000-0000000000f1', 'developer-manager', 'x')"
            )


def test_rows_written_before_the_talent_migrations_stay_valid(empty_database: str) -> None:
    migrate.upgrade(empty_database, "0001")
    with psycopg.connect(empty_database, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO identity.talent_import_runs (id, mode, correlation_id)"
            " VALUES ('00000000-0000-4000-8000-0000000000a1', 'ApiPull', gen_random_uuid())"
        )
        conn.execute(
            "INSERT INTO identity.talent_import_failed_items (id, run_id, stage, error_code)"
            " VALUES (gen_random_uuid(), '00000000-0000-4000-8000-0000000000a1', 'Users', 'X')"
        )
    migrate.upgrade(empty_database)
    with psycopg.connect(empty_database) as conn:
        run = conn.execute(
            "SELECT status, tenants_listed, users_listed, plan_page_no FROM identity.talent_import_runs"
        ).fetchone()
        item = conn.execute(
            "SELECT attempt_count, next_attempt_at FROM identity.talent_import_failed_items"
        ).fetchone()
    assert run == ("Running", False, False, 0)
    assert item == (1, None)
