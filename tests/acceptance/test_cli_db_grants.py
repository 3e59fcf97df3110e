"""`pin-identity db grants`: the grant table as SQL, the text deploy/README.md shows; applied by the schema's
owner; and a job whose role lacks a row refuses to start, in one line naming it."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from pin_identity.adapters.postgres.grants import TableGrant
from pin_identity.config import Settings
from tests.support.cli import run_cli, unconfigured_environment
from tests.support.database_roles import DatabaseRoles, database_roles

README = Path(__file__).resolve().parents[2] / "deploy" / "README.md"


def _shown(part: str) -> str:
    """The SQL block of deploy/README.md's database section that follows `part`."""
    section = README.read_text().split("### Database roles", 1)[1].split(part, 1)[1]
    block = re.search(r"```sql\n(.*?)```", section, re.DOTALL)
    assert block is not None
    return block.group(1)


@pytest.mark.parametrize(
    ("flags", "part"), [((), "The owner's part"), (("--administrator",), "The administrator's part")]
)
def test_the_printed_sql_is_the_deploy_readmes_and_grants_nothing_broader(
    flags: tuple[str, ...], part: str, tmp_path: Path
) -> None:
    env = {
        **unconfigured_environment(),
        "PIN_IDENTITY_DATA_DIR": str(tmp_path),
        "PIN_IDENTITY_DATABASE_URL": "postgresql://db.internal/identity",  # printed, never connected to
    }
    done = run_cli(env, "db", "grants", *flags)
    assert done.returncode == 0, done.stderr
    assert _shown(part) == done.stdout, f"deploy/README.md: paste `pin-identity db grants {' '.join(flags)}`"
    assert not re.search(r"ALL PRIVILEGES|GRANT ALL|SUPERUSER|CREATEROLE|BYPASSRLS|TO PUBLIC", done.stdout)


def test_a_malformed_role_is_one_line_and_exit_2(tmp_path: Path) -> None:
    env = {**unconfigured_environment(), "PIN_IDENTITY_DATA_DIR": str(tmp_path)}
    done = run_cli(env, "db", "grants", "--role", "relay=relay_prod")
    assert done.returncode == 2
    assert "'relay=relay_prod' is not JOB=ROLE with JOB one of migrations, outbox-relay" in done.stderr
    assert done.stdout == ""


@pytest.fixture
def roles(postgres_admin_url: str, settings: Settings) -> Iterator[DatabaseRoles]:
    with database_roles(postgres_admin_url, settings) as made:
        yield made


def test_a_job_whose_role_lacks_a_row_exits_2_naming_it_and_the_owner_restores_it(
    roles: DatabaseRoles, subprocess_env: dict[str, str]
) -> None:
    roles.revoke(TableGrant("access-fanout", ("INSERT",), "outbox_events"))
    fanout = {**subprocess_env, "PIN_IDENTITY_DATABASE_URL": roles.url("access-fanout")}
    refused = run_cli(fanout, "worker", "--jobs", "access-fanout", "--once")
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines() == [
        f"error: PIN_IDENTITY_DATABASE_URL: role {roles.names['access-fanout']} lacks INSERT on "
        "identity.outbox_events (`pin-identity db grants` says what each job needs)"
    ]
    renamed = [f"--role={job}={name}" for job, name in roles.names.items()]
    relay = {**subprocess_env, "PIN_IDENTITY_DATABASE_URL": roles.url("outbox-relay")}
    not_the_owner = run_cli(relay, "db", "grants", "--apply", *renamed)
    assert not_the_owner.returncode == 2
    (line,) = not_the_owner.stderr.splitlines()
    assert line.startswith("error: PIN_IDENTITY_DATABASE_URL: permission denied for table ")
    assert line.endswith("; apply it as the schema's owner")
    owner = {**subprocess_env, "PIN_IDENTITY_DATABASE_URL": roles.url("migrations")}
    no_such_role = run_cli(owner, "db", "grants", "--apply", *renamed, "--role=serve=nobody_here")
    assert no_such_role.returncode == 2
    assert no_such_role.stderr.splitlines() == [
        'error: PIN_IDENTITY_DATABASE_URL: role "nobody_here" does not exist; '
        "apply the administrator's part first (`db grants --administrator`)"
    ]
    applied = run_cli(owner, "db", "grants", "--apply", *renamed)
    assert applied.returncode == 0 and applied.stdout.startswith("applied "), applied.stderr
    assert run_cli(fanout, "worker", "--jobs", "access-fanout", "--once").returncode == 0
    # A statement the role may not run (the fan-out's role reads no company): one line, exit 2.
    not_its_own = run_cli(fanout, "roles", "list")
    assert not_its_own.returncode == 2
    assert not_its_own.stderr.splitlines() == [
        "error: PIN_IDENTITY_DATABASE_URL: permission denied for table companies "
        "(`pin-identity db grants` says what each job needs)"
    ]
