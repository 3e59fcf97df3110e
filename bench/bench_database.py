"""What the benchmarks do to their PostgreSQL before a run: a scratch folder for the servers, a fresh migrated
database, a seeded role, a checkpoint."""

from __future__ import annotations

import random
import shutil
import sys
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from pathlib import Path

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from pin_identity.adapters.postgres import migrate
from pin_identity.adapters.postgres.embedded_postgres import ensure_embedded_postgres, stop_embedded_postgres

# The repository: the benchmarks write their bulk rows as the tests do (tests/support/seed.py).
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.seed import BulkAssignment, bulk_company, copy_assignments, copy_users


@contextmanager
def scratch_dir(prefix: str) -> Iterator[Path]:
    """A temporary folder for a benchmark's servers and logs, removed after a clean run (a million-user
    fan-out leaves gigabytes of tables and WAL), kept after a failed one for its logs."""
    workdir = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield workdir
    except BaseException:
        print(f"kept for its logs: {workdir}", file=sys.stderr)
        raise
    shutil.rmtree(workdir, ignore_errors=True)


@contextmanager
def embedded_postgres(workdir: Path) -> Iterator[str]:
    """The benchmark's own PostgreSQL server, in `workdir`: its admin URL; stopped at the end."""
    admin_url = ensure_embedded_postgres(workdir, database="postgres")
    try:
        yield admin_url
    finally:
        stop_embedded_postgres(workdir)


def fresh_database(admin_url: str, name: str) -> str:
    """A new database; earlier bench databases are dropped so that no autovacuum of theirs runs meanwhile."""
    with psycopg.connect(admin_url, autocommit=True) as conn:
        for (old,) in conn.execute(
            "SELECT datname FROM pg_database WHERE datname LIKE 'bench\\_%'"
        ).fetchall():
            conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(old)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = psycopg.conninfo.make_conninfo(admin_url, dbname=name)
    migrate.upgrade(url)
    return url


def replica_counts(url: str) -> dict[str, int]:
    """What the Talent replica holds: companies and users from Talent, and the events it wrote."""
    with psycopg.connect(url, row_factory=dict_row) as conn:
        counts = conn.execute(
            "SELECT (SELECT count(*) FROM identity.companies"
            "        WHERE external_talent_tenant_id IS NOT NULL) AS companies,"
            " (SELECT count(*) FROM identity.users WHERE external_talent_user_id IS NOT NULL) AS users,"
            " (SELECT count(*) FROM identity.outbox_events) AS outbox_events"
        ).fetchone()
    assert counts is not None
    return dict(counts)


def checkpoint(url: str) -> None:
    """Earlier writes are flushed before the clock starts."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CHECKPOINT")


# ---------------------------------------------------------------- a role to fan out


@dataclass(frozen=True)
class BenchRoles:
    company_id: uuid.UUID
    role_id: uuid.UUID  # the role whose permissions the benchmark changes
    other_roles: tuple[uuid.UUID, ...]


ROLE_CODES = ("sales-manager", "chessboard-viewer", "deal-approver")  # the benchmark's role, then the others


class SeedShape(StrEnum):
    """`simple`: the role in one scope (a fifth of its users twice), a third also hold a second role.
    `realistic`: what a company's data looks like after a while; see `realistic_assignments`."""

    SIMPLE = "simple"
    REALISTIC = "realistic"


def seed_role(url: str, users: int, shape: SeedShape = SeedShape.SIMPLE) -> uuid.UUID:
    """A company and a role held by `users` users (plus, in the realistic shape, former holders); the
    tables are vacuumed, analyzed and checkpointed before the clock starts. Returns the role's id."""
    rng = random.Random(users)
    with psycopg.connect(url) as conn, conn.cursor() as cur:
        company_id, (role_id, *other_roles) = bulk_company(cur, "Bench", ROLE_CODES)
        roles = BenchRoles(company_id, role_id, tuple(other_roles))
        holders = [uuid.uuid4() for _ in range(users)]
        former = [uuid.uuid4() for _ in range(users // 10)] if shape is SeedShape.REALISTIC else []
        copy_users(cur, company_id, holders + former)
        # In the order users were granted, not by id: the heap is not clustered on user_id, as in life.
        grants = {user_id: _assignments_of(shape, roles, rng) for user_id in holders}
        grants.update({user_id: _former_holder(roles, rng) for user_id in former})
        copy_assignments(cur, company_id, grants)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")
        conn.execute("CHECKPOINT")  # the seeding's writes are flushed before the clock starts
    return roles.role_id


def _assignments_of(shape: SeedShape, roles: BenchRoles, rng: random.Random) -> list[BulkAssignment]:
    if shape is SeedShape.REALISTIC:
        return realistic_assignments(roles, rng)
    grants = [BulkAssignment(roles.role_id)]
    if rng.random() < 0.2:
        grants.append(BulkAssignment(roles.role_id, "Project", project_id=uuid.uuid4()))
    if rng.random() < 0.33:
        grants.append(BulkAssignment(roles.other_roles[0]))
    return grants


def realistic_assignments(roles: BenchRoles, rng: random.Random) -> list[BulkAssignment]:
    """About 2.5 rows per holder: the role company-wide, a third also on a project (some of those
    expiring), other roles held or held once (Revoked, Expired), so pages and snapshots step over
    rows that are not Active."""
    now = datetime.now(UTC)
    viewer, approver = roles.other_roles
    grants = [BulkAssignment(roles.role_id)]
    if rng.random() < 1 / 3:
        expires = now + timedelta(days=rng.randint(1, 90)) if rng.random() < 0.3 else None
        grants.append(BulkAssignment(roles.role_id, "Project", expires_at=expires, project_id=uuid.uuid4()))
    if rng.random() < 0.5:
        grants.append(BulkAssignment(viewer))
    if rng.random() < 0.3:
        grants.append(BulkAssignment(approver, expires_at=now + timedelta(days=rng.randint(1, 30))))
    if rng.random() < 0.25:
        grants.append(BulkAssignment(roles.role_id, "Project", "Revoked", project_id=uuid.uuid4()))
    if rng.random() < 0.12:
        grants.append(BulkAssignment(approver, "Project", "Expired", now - timedelta(days=3), uuid.uuid4()))
    return grants


def _former_holder(roles: BenchRoles, rng: random.Random) -> list[BulkAssignment]:
    """A user whose grant of the role was revoked: in `users`, never in the role's pages."""
    grants = [BulkAssignment(roles.role_id, status="Revoked")]
    if rng.random() < 0.5:
        grants.append(BulkAssignment(roles.other_roles[0]))
    return grants
