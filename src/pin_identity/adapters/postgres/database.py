"""Connections: one pool per process, every connection with statement and idle-in-transaction limits."""

from __future__ import annotations

import time
import weakref
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar
from uuid import UUID

import psycopg
from psycopg.rows import RowFactory
from psycopg_pool import ConnectionPool

from pin_identity.adapters.postgres.catalogue import query
from pin_identity.domain.errors import LeaseLostError

Row = TypeVar("Row")


def read(
    conn: psycopg.Connection, name: str, params: Mapping[str, Any] | None, row_factory: RowFactory[Row]
) -> psycopg.Cursor[Row]:
    """A named statement whose rows come out as `row_factory` makes them: by column name (psycopg.rows), so a
    reordered SELECT shifts no field."""
    return conn.cursor(row_factory=row_factory).execute(query(name), params)


@dataclass(frozen=True)
class ConnectionLimits:
    statement_timeout_ms: int = 30_000
    idle_in_transaction_timeout_ms: int = 60_000

    def options(self) -> str:
        return (
            f"-c statement_timeout={self.statement_timeout_ms} "
            f"-c idle_in_transaction_session_timeout={self.idle_in_transaction_timeout_ms} "
            "-c search_path=identity,public"
        )


@dataclass(frozen=True)
class Fence:
    """The lease a transaction writes under: the named statement returns a row (and locks the leased row until
    the transaction ends) only while the lease is still the caller's."""

    statement: str
    params: Mapping[str, Any]
    leased_id: UUID

    def hold(self, conn: psycopg.Connection) -> None:
        self.check(self.send(conn))

    def send(self, conn: psycopg.Connection) -> psycopg.Cursor[Any]:
        """The fence's statement, unread: in pipeline mode it travels with the statements after it."""
        return conn.execute(query(self.statement), self.params)

    def check(self, reply: psycopg.Cursor[Any]) -> None:
        if reply.fetchone() is None:
            raise LeaseLostError(str(self.leased_id))


# A connection given back to the pool less than this long ago is handed out again unchecked: the check is a
# round trip per transaction, a tenth of a fan-out page's time (PgBouncer's server_check_delay is the same
# idea). A server that went away within the window fails the first statement on it; the pool drops that
# connection when it comes back.
TRUSTED_AFTER_USE_S = 2.0


class Database:
    """The process's pool plus dedicated connections for the few places that hold a session."""

    def __init__(self, url: str, *, limits: ConnectionLimits, max_size: int = 10, name: str = "pin-identity"):
        self.url = url
        self.limits = limits
        self._given_back: weakref.WeakKeyDictionary[psycopg.Connection, float] = weakref.WeakKeyDictionary()
        self._pool = ConnectionPool(
            url,
            min_size=1,
            max_size=max_size,
            kwargs={"options": limits.options(), "application_name": name},
            open=False,
            name=name,
            check=self._check,
        )

    def _check(self, conn: psycopg.Connection) -> None:
        if time.monotonic() - self._given_back.get(conn, float("-inf")) > TRUSTED_AFTER_USE_S:
            ConnectionPool.check_connection(conn)

    def open(self, timeout_s: float = 10.0) -> Database:
        """Fail fast with the server's own reason rather than a pool that retries in the background."""
        with psycopg.connect(self.url, connect_timeout=max(1, int(timeout_s))):
            pass
        self._pool.open(wait=True, timeout=timeout_s)
        return self

    def close(self) -> None:
        self._pool.close()

    def execute(self, name: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        """One named statement in its own transaction; the rows it returned, if it returns any."""
        with self.connection() as conn:
            cursor = conn.execute(query(name), params)
            return cursor.fetchall() if cursor.description is not None else []

    def fetch(self, name: str, params: Mapping[str, Any], row_factory: RowFactory[Row]) -> list[Row]:
        """The rows of one named statement in its own transaction, made by `row_factory`."""
        with self.connection() as conn:
            return read(conn, name, params, row_factory).fetchall()

    def fetch_one(self, name: str, params: Mapping[str, Any], row_factory: RowFactory[Row]) -> Row | None:
        """The first row of one named statement in its own transaction, None when it returns none."""
        with self.connection() as conn:
            return read(conn, name, params, row_factory).fetchone()

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection]:
        with self._pool.connection() as conn:
            try:
                yield conn
            finally:
                self._given_back[conn] = time.monotonic()

    @contextmanager
    def transaction(self, fence: Fence | None = None) -> Iterator[psycopg.Connection]:
        """One transaction on a pooled connection: what the block leaves uncommitted is rolled back, so the
        pool gets a clean connection. A fence is checked first: LeaseLostError when the lease is gone."""
        with self.connection() as conn:
            try:
                if fence is not None:
                    fence.hold(conn)
                yield conn
            finally:
                conn.rollback()

    def dedicated(self, *, autocommit: bool = True, name: str = "pin-identity") -> psycopg.Connection:
        """A connection outside the pool, for a session-level advisory lock or LISTEN."""
        return psycopg.connect(
            self.url, autocommit=autocommit, options=self.limits.options(), application_name=name
        )

    def ping(self) -> bool:
        try:
            with self.connection() as conn:
                conn.execute(query("ping"))
            return True
        except psycopg.Error:
            return False
