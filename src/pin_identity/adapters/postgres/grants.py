"""What each job may do in PostgreSQL, and nothing more: one table, printed by `pin-identity db grants` (the
SQL deploy/README.md shows), checked by each job as it starts, and applied as it is by the tests, so that what
is documented is what is proven.

Two parts, for the two people who may run them. The administrator's, once: a login role per job, the
writers' `idle_in_transaction_session_timeout` (a session of that role that someone leaves open in a
transaction holds row locks the jobs wait on), and `pg_read_all_stats` for `serve`, whose outbox gauges and
import status name the session of another role holding the outbox's horizon or the run lock (without it
PostgreSQL shows those fields as null). The schema owner's, after every `db upgrade`: usage of the schema and
the privileges on its tables, each job's revoked first so that applying it leaves exactly the table's.

A row lock (`FOR UPDATE`, `FOR KEY SHARE`) takes PostgreSQL's UPDATE privilege on the locked table: the
fan-out locks its page's users to serialise with point changes and writes none of them, so it holds UPDATE
on one column only, `id`, which no statement of ours changes and the foreign keys of assignments guard.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import psycopg
from psycopg import sql
from psycopg.rows import tuple_row

from pin_identity.adapters.postgres.database import read

SCHEMA = "identity"
# The owner of the schema runs the migrations (`db upgrade`) and applies the table below; it needs CREATE on
# the database and nothing of the jobs' roles.
OWNER = "migrations"
JOBS = ("outbox-relay", "access-fanout", "talent-sync", "talent-import", "serve")
# Jobs whose statements the administrator's grant of pg_read_all_stats serves (see above).
READS_OTHER_SESSIONS = ("serve",)

_REPLICA = (
    ("companies", ("SELECT", "INSERT", "UPDATE")),
    ("users", ("SELECT", "INSERT", "UPDATE")),
    ("role_assignments", ("SELECT", "INSERT", "UPDATE")),
    ("role_definitions", ("SELECT",)),
    ("talent_deletions", ("SELECT", "INSERT")),
    ("talent_import_failed_items", ("SELECT", "INSERT", "UPDATE", "DELETE")),
    ("outbox_events", ("INSERT",)),  # the access events of assignments the replica grants or revokes
)


# What `serve` holds as the replica does (replaying quarantined items applies them); its own rows below widen
# the roles' and the outbox's.
_SERVE_AS_REPLICA = frozenset(table for table, _ in _REPLICA) - {"role_definitions", "outbox_events"}


@dataclass(frozen=True)
class TableGrant:
    """One row of the table: a job's role may do `privileges` on one relation of the schema. A privilege may
    name its columns (`UPDATE (id)`)."""

    job: str
    privileges: tuple[str, ...]
    relation: str
    sequence: bool = False

    def __str__(self) -> str:
        return f"{self.job}: {', '.join(self.privileges)} on {SCHEMA}.{self.relation}"

    def grant(self, role: str) -> sql.Composed:
        kind = sql.SQL("SEQUENCE ") if self.sequence else sql.SQL("")
        return sql.SQL("GRANT {} ON {}{} TO {}").format(
            sql.SQL(", ".join(self.privileges)),
            kind,
            sql.Identifier(SCHEMA, self.relation),
            sql.Identifier(role),
        )


def job_grants() -> list[TableGrant]:
    """The whole table, job by job."""
    return [
        # Reads what is committed, deletes what the broker acknowledged, moves a poison row aside.
        TableGrant("outbox-relay", ("SELECT", "DELETE"), "outbox_events"),
        TableGrant("outbox-relay", ("INSERT",), "outbox_dead_letters"),
        TableGrant("outbox-relay", ("SELECT", "UPDATE"), "outbox_relay_handover"),
        # The id horizon: how far the sequence has handed out ids.
        TableGrant("outbox-relay", ("SELECT",), "outbox_events_id_seq", sequence=True),
        TableGrant("access-fanout", ("SELECT", "UPDATE"), "access_fanout_tasks"),
        TableGrant("access-fanout", ("SELECT", "UPDATE (id)"), "users"),  # the page's row locks
        TableGrant("access-fanout", ("SELECT",), "role_assignments"),
        TableGrant("access-fanout", ("SELECT",), "role_definitions"),
        TableGrant("access-fanout", ("INSERT", "SELECT (id)"), "outbox_events"),  # its pace: the id range
        *(TableGrant("talent-sync", privileges, table) for table, privileges in _REPLICA),
        *(TableGrant("talent-import", privileges, table) for table, privileges in _REPLICA),
        TableGrant("talent-import", ("SELECT", "INSERT", "UPDATE"), "talent_import_runs"),
        TableGrant("talent-import", ("SELECT", "INSERT", "UPDATE"), "talent_import_pages"),
        TableGrant("talent-import", ("SELECT", "INSERT", "UPDATE"), "talent_import_dry_run_states"),
        TableGrant("talent-import", ("SELECT", "INSERT"), "talent_import_dry_run_phones"),
        # The admin API and the operator commands: a role's permissions changed (a small role's fan-out
        # inline), tasks replayed, discarded and pruned, runs started and cancelled, quarantined items
        # replayed into the replica, and what the console and the gauges read.
        *(
            TableGrant("serve", privileges, table)
            for table, privileges in _REPLICA
            if table in _SERVE_AS_REPLICA
        ),
        TableGrant("serve", ("SELECT", "UPDATE"), "role_definitions"),
        TableGrant("serve", ("SELECT", "INSERT", "DELETE"), "role_permissions"),
        TableGrant("serve", ("SELECT", "INSERT", "UPDATE", "DELETE"), "access_fanout_tasks"),
        TableGrant("serve", ("SELECT", "INSERT"), "outbox_events"),
        TableGrant("serve", ("SELECT",), "outbox_events_id_seq", sequence=True),  # the backlog's horizon
        TableGrant("serve", ("SELECT",), "outbox_dead_letters"),
        TableGrant("serve", ("SELECT", "INSERT", "UPDATE", "DELETE"), "talent_import_runs"),
        TableGrant("serve", ("SELECT",), "talent_import_pages"),
        TableGrant("serve", ("SELECT",), "talent_import_dry_run_states"),
        TableGrant("serve", ("SELECT",), "talent_import_dry_run_phones"),
    ]


def default_roles() -> dict[str, str]:
    return {job: f"pin_identity_{job.replace('-', '_')}" for job in (OWNER, *JOBS)}


def owner_script(grants: Sequence[TableGrant], roles: Mapping[str, str]) -> list[sql.Composed]:
    """The schema owner's statements: each job's privileges revoked, then granted as the table says."""
    statements: list[sql.Composed] = []
    schema = sql.Identifier(SCHEMA)
    for job in JOBS:
        role = sql.Identifier(roles[job])
        statements += [
            sql.SQL("REVOKE ALL ON ALL TABLES IN SCHEMA {} FROM {}").format(schema, role),
            sql.SQL("REVOKE ALL ON ALL SEQUENCES IN SCHEMA {} FROM {}").format(schema, role),
            sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(schema, role),
            *(row.grant(roles[job]) for row in grants if row.job == job),
        ]
    return statements


def administrator_script(roles: Mapping[str, str], database: str, idle_timeout_ms: int) -> list[sql.Composed]:
    """The administrator's statements: the roles (passwords are set apart, e.g. psql's \\password), the
    owner's right to create the schema, the writers' timeout and what only an administrator may grant."""
    role = {job: sql.Identifier(name) for job, name in roles.items()}
    timeout = sql.Literal(f"{idle_timeout_ms}ms")
    return [
        *(sql.SQL("CREATE ROLE {} LOGIN").format(role[job]) for job in (OWNER, *JOBS)),
        sql.SQL("GRANT CREATE ON DATABASE {} TO {}").format(sql.Identifier(database), role[OWNER]),
        *(
            sql.SQL("ALTER ROLE {} SET idle_in_transaction_session_timeout = {}").format(role[job], timeout)
            for job in JOBS
        ),
        *(sql.SQL("GRANT pg_read_all_stats TO {}").format(role[job]) for job in READS_OTHER_SESSIONS),
    ]


@dataclass(frozen=True)
class MissingGrant:
    """A privilege of the table that the connected role does not hold."""

    role: str
    privilege: str
    relation: str

    def __str__(self) -> str:
        return f"role {self.role} lacks {self.privilege} on {SCHEMA}.{self.relation}"


def missing_grants(conn: psycopg.Connection, grants: Sequence[TableGrant]) -> list[MissingGrant]:
    """What of `grants` the connection's role does not hold (itself or through a role it belongs to), in one
    round trip. A relation the schema does not have yet is not a grant's problem: `db upgrade` says that."""
    checks = [(row, privilege) for row in grants for privilege in row.privileges]
    params = {
        "relations": [f"{SCHEMA}.{row.relation}" for row, _ in checks],
        "privileges": [privilege.partition(" ")[0] for _, privilege in checks],
        "columns": [privilege.partition(" ")[2].strip("()") or None for _, privilege in checks],
        "sequences": [row.sequence for row, _ in checks],
    }
    rows = read(conn, "missing_privileges", params, tuple_row).fetchall()
    missing = {(relation, privilege) for _, relation, privilege in rows}
    role = str(rows[0][0]) if rows else ""
    return [
        MissingGrant(role, privilege, row.relation)
        for row, privilege in checks
        if (f"{SCHEMA}.{row.relation}", privilege) in missing
    ]


@dataclass(frozen=True)
class Applied:
    statements: int
    existing_roles: list[str]


def apply(url: str, statements: Sequence[sql.Composed]) -> Applied:
    """Run `statements` in one transaction as the URL's role. A role that exists already is kept as it is
    (its password among what an administrator set), so the administrator's part may be applied again."""
    existing: list[str] = []
    with psycopg.connect(url) as conn, conn.transaction():
        for statement in statements:
            try:
                with conn.transaction():  # a savepoint: a role found is skipped, the rest goes on
                    conn.execute(statement)
            except psycopg.errors.DuplicateObject:
                existing.append(statement.as_string(conn))
    return Applied(len(statements) - len(existing), existing)
