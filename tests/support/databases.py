"""Databases on the tests' PostgreSQL: the migrated template, and fresh copies of it for a test or module."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from psycopg import sql

from pin_identity.adapters.postgres import migrate

TEMPLATE = "pin_template"
_numbers = itertools.count()


def with_database(url: str, name: str) -> str:
    """The same server's URL, on another database."""
    return psycopg.conninfo.make_conninfo(url, dbname=name)


def create_template(admin_url: str) -> None:
    """The migrated database every test's database is copied from (a copy is cheaper than migrating)."""
    create_database(admin_url, TEMPLATE, template=None)
    migrate.upgrade(with_database(admin_url, TEMPLATE))


def create_database(admin_url: str, name: str, *, template: str | None = TEMPLATE) -> str:
    """A new database (one left by an earlier run under the same name is dropped first); returns its URL."""
    statement = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
    if template is not None:
        statement += sql.SQL(" TEMPLATE {}").format(sql.Identifier(template))
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        conn.execute(statement)
    return with_database(admin_url, name)


def drop_database(admin_url: str, name: str) -> None:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@contextmanager
def scratch_database(
    admin_url: str, name: str | None = None, *, template: str | None = TEMPLATE
) -> Iterator[str]:
    """A new database for the block (named after this process unless `name` is given), dropped after it."""
    name = name or f"t_{os.getpid()}_{next(_numbers)}"
    url = create_database(admin_url, name, template=template)
    try:
        yield url
    finally:
        drop_database(admin_url, name)


def unix_socket(url: str) -> str:
    """The path of the Unix socket that a libpq URL of a directory host names (the embedded server listens on
    no TCP port)."""
    params = psycopg.conninfo.conninfo_to_dict(url)
    return f"{params['host']}/.s.PGSQL.{params.get('port') or 5432}"


def through_port(url: str, port: int) -> str:
    """The same database reached over TCP on loopback at `port` (a proxy's)."""
    return psycopg.conninfo.make_conninfo(url, host="127.0.0.1", port=str(port))
