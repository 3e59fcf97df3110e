"""Each job's database role made as deploy/README.md says: the administrator's part of `db grants` applied by
the tests' superuser, then the schema migrated and the owner's part applied by the owner's role, on a database
of the test's own. Roles belong to the whole server, so their names carry a suffix of the test's."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from pin_identity.adapters.postgres.grants import SCHEMA, TableGrant
from pin_identity.composition import Container, privileges
from pin_identity.composition.privileges import DATABASE_JOBS
from pin_identity.config import Settings
from tests.support.databases import create_database, drop_database


@dataclass(frozen=True)
class DatabaseRoles:
    database_url: str  # the superuser's
    names: dict[str, str]  # job -> role

    def url(self, job: str) -> str:
        """The test database as `job`'s role (the embedded server trusts its local socket)."""
        return make_conninfo(self.database_url, user=self.names[job])

    def settings(self, base: Settings, job: str) -> Settings:
        return base.model_copy(update={"database_url": self.url(job)})

    def revoke(self, row: TableGrant) -> None:
        """Take one row of the table from its job's role, as its owner would."""
        statement = sql.SQL("REVOKE {} ON {}{} FROM {}").format(
            sql.SQL(", ".join(row.privileges)),
            sql.SQL("SEQUENCE " if row.sequence else ""),
            sql.Identifier(SCHEMA, row.relation),
            sql.Identifier(self.names[row.job]),
        )
        with psycopg.connect(self.url("migrations"), autocommit=True) as conn:
            conn.execute(statement)


@contextmanager
def database_roles(admin_url: str, base: Settings) -> Iterator[DatabaseRoles]:
    suffix = uuid.uuid4().hex[:8]
    names = {job: f"pin_identity_{job.replace('-', '_')}_{suffix}" for job in DATABASE_JOBS}
    database = f"roles_{suffix}"
    roles = DatabaseRoles(create_database(admin_url, database, template=None), names)
    try:
        _apply(base.model_copy(update={"database_url": roles.database_url}), names, administrator=True)
        owner = roles.settings(base, "migrations")
        with _container(owner) as container:
            container.connections.upgrade_schema()
        _apply(owner, names, administrator=False)
        yield roles
    finally:
        drop_database(admin_url, database)
        with psycopg.connect(admin_url, autocommit=True) as conn:
            for role in names.values():
                conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))


def _apply(settings: Settings, names: dict[str, str], *, administrator: bool) -> None:
    with _container(settings) as container:
        privileges.apply_database_grants(container.connections, names, administrator=administrator)


@contextmanager
def _container(settings: Settings) -> Iterator[Container]:
    container = Container(settings)
    try:
        yield container
    finally:
        container.close()
