"""The grant table and the SQL made of it (adapters/postgres/grants.py); that it suffices and that each row is
checked at start is tests/integration/test_database_roles.py's."""

from __future__ import annotations

import re

from psycopg import sql

from pin_identity.adapters.postgres import grants

ROLES = grants.default_roles()


def _rendered(statements: list[sql.Composed]) -> list[str]:
    return [statement.as_string(None) for statement in statements]


def test_every_job_has_rows_and_only_data_privileges() -> None:
    rows = grants.job_grants()
    assert {row.job for row in rows} == set(grants.JOBS)
    for row in rows:
        for privilege in row.privileges:
            assert re.fullmatch(r"(SELECT|INSERT|UPDATE|DELETE)( \(\w+\))?", privilege), row
    assert len({(row.job, row.relation) for row in rows}) == len(rows), "one row per job and relation"


def test_the_owners_part_revokes_each_jobs_privileges_before_granting_its_rows() -> None:
    lines = _rendered(grants.owner_script(grants.job_grants(), ROLES))
    for job in grants.JOBS:
        role = f'"{ROLES[job]}"'
        own = [line for line in lines if line.endswith(role)]
        assert own[:3] == [
            f'REVOKE ALL ON ALL TABLES IN SCHEMA "identity" FROM {role}',
            f'REVOKE ALL ON ALL SEQUENCES IN SCHEMA "identity" FROM {role}',
            f'GRANT USAGE ON SCHEMA "identity" TO {role}',
        ]
        assert len(own) == 3 + sum(row.job == job for row in grants.job_grants())
    assert 'GRANT SELECT, UPDATE (id) ON "identity"."users" TO "pin_identity_access_fanout"' in lines


def test_the_administrators_part_makes_the_roles_and_bounds_only_the_writers() -> None:
    lines = _rendered(grants.administrator_script(ROLES, "identity", 60_000))
    assert lines[: len(ROLES)] == [f'CREATE ROLE "{role}" LOGIN' for role in ROLES.values()]
    assert 'GRANT CREATE ON DATABASE "identity" TO "pin_identity_migrations"' in lines
    bounded = [line for line in lines if "idle_in_transaction_session_timeout = '60000ms'" in line]
    assert len(bounded) == len(grants.JOBS) and not any("migrations" in line for line in bounded)
    assert [line for line in lines if "pg_read_all_stats" in line] == [
        'GRANT pg_read_all_stats TO "pin_identity_serve"'
    ]
