"""Connections: one pool per process, every connection with statement and idle-in-transaction limits; a
session that others wait on (the relay's lock) also with a limit on how long its path may stay silent."""

from __future__ import annotations

import math
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
from pin_identity.adapters.postgres.holder_session import HolderSession, holder_session_name
from pin_identity.adapters.system_clock import SYSTEM_CLOCK
from pin_identity.domain.clock import Clock
from pin_identity.domain.errors import LeaseLostError

Row = TypeVar("Row")
# Before every uuid in PostgreSQL's order: where a keyset walk over ids starts.
NIL_UUID = UUID(int=0)


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


# transaction_timeout exists from PostgreSQL 17 (server_version_num); an older server refuses the name.
TRANSACTION_TIMEOUT_SINCE = 170_000


@dataclass(frozen=True)
class SilenceLimit:
    """How long a session's path to the server may stay silent before both ends give the session up: for a
    session whose end others wait for (the relay's advisory lock goes with it), where TCP's own defaults
    (about two hours of keepalive, fifteen minutes of retransmission) would keep a vanished client's session.

    The server ends the session once it has waited `after_s` for the next statement (`idle_session_timeout`),
    once a transaction has lasted that long (`transaction_timeout`, PostgreSQL 17 and later: a pipeline's
    statements wait for their sync inside one, where no idle timeout runs), or once the client has left a
    reply unacknowledged that long (`tcp_user_timeout`); its keepalive probes find a vanished peer within as
    long. All are the session's own settings, sent with the connection. The first two hold whatever sits on
    the path (a proxy that still acknowledges every byte); the TCP ones, like the client's keepalives and
    `tcp_user_timeout` below, see only a path that drops packets: on such a path the client waits no longer
    than `after_s` either, nor for a connection to open. A wait the client's TCP cannot see end is for its
    owner to notice (WaitWatch)."""

    after_s: float
    # A session idle by design (a claim holder's, which only holds its lock): its path is watched (keepalives,
    # unacknowledged replies), its idleness is not.
    idle_allowed: bool = False

    @property
    def _keepalive(self) -> tuple[int, int, int]:
        """Idle seconds before the first probe, seconds between probes, probes: `after_s` in all."""
        idle = max(1, round(self.after_s / 3))
        interval = max(1, round(self.after_s / 6))
        return idle, interval, max(1, int((self.after_s - idle) // interval))

    def server_options(self, server_version: int) -> str:
        idle, interval, count = self._keepalive
        after_ms = round(self.after_s * 1000)
        options = (
            f"-c tcp_user_timeout={after_ms} -c tcp_keepalives_idle={idle} "
            f"-c tcp_keepalives_interval={interval} -c tcp_keepalives_count={count}"
        )
        if self.idle_allowed:
            return options
        options += f" -c idle_session_timeout={after_ms}"
        if server_version >= TRANSACTION_TIMEOUT_SINCE:
            options += f" -c transaction_timeout={after_ms}"
        return options

    def client_parameters(self) -> dict[str, int]:
        """libpq's connection parameters of the same bound."""
        idle, interval, count = self._keepalive
        return {
            "keepalives": 1,
            "keepalives_idle": idle,
            "keepalives_interval": interval,
            "keepalives_count": count,
            "tcp_user_timeout": round(self.after_s * 1000),
            "connect_timeout": max(2, math.ceil(self.after_s)),  # libpq's least
        }


# A claim holder's session (holder_session.py): a host that vanished takes its session, and its claims' holder
# locks, with it within 20 s, the keepalive probes' bound; a killed process at once.
HOLDER_PATH_LIMIT = SilenceLimit(20.0, idle_allowed=True)


class WaitWatch:
    """When a session's current wait on the server began, read from another thread (a liveness probe): a
    wait that outlasts the session's SilenceLimit is a path that went silent where no timeout of the client
    sees it (TCP still carries it, nothing answers)."""

    def __init__(self, clock: Clock = SYSTEM_CLOCK):
        self._clock = clock
        self._since: float | None = None

    @contextmanager
    def waiting(self) -> Iterator[None]:
        self._since = self._clock.monotonic()
        try:
            yield
        finally:
            self._since = None

    def waited_s(self) -> float:
        """How long the current wait has lasted; 0 between waits."""
        since = self._since
        return 0.0 if since is None else self._clock.monotonic() - since


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

    def __init__(
        self,
        url: str,
        *,
        limits: ConnectionLimits,
        max_size: int = 10,
        name: str = "pin-identity",
        clock: Clock = SYSTEM_CLOCK,
    ):
        self.url = url
        self._clock = clock
        self.limits = limits
        self.server_version = 0  # server_version_num, known once open
        self._given_back: weakref.WeakKeyDictionary[psycopg.Connection, float] = weakref.WeakKeyDictionary()
        self._holder = HolderSession(
            lambda: self.dedicated(name=holder_session_name(), silence=HOLDER_PATH_LIMIT)
        )
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
        if self._clock.monotonic() - self._given_back.get(conn, float("-inf")) > TRUSTED_AFTER_USE_S:
            ConnectionPool.check_connection(conn)

    def open(self, timeout_s: float = 10.0) -> Database:
        """Fail fast with the server's own reason rather than a pool that retries in the background."""
        with psycopg.connect(self.url, connect_timeout=max(1, int(timeout_s))) as conn:
            self.server_version = conn.info.server_version
        self._pool.open(wait=True, timeout=timeout_s)
        return self

    def close(self) -> None:
        self._holder.close()
        self._pool.close()

    def holder_key(self) -> int:
        """The key of this process's claim holder session, which a claim records (opened on the first)."""
        return self._holder.key()

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
                self._given_back[conn] = self._clock.monotonic()

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

    def dedicated(
        self, *, autocommit: bool = True, name: str = "pin-identity", silence: SilenceLimit | None = None
    ) -> psycopg.Connection:
        """A connection outside the pool, for a session-level advisory lock or LISTEN; with `silence`, one
        that both ends give up once its path stays silent that long."""
        if silence is None:
            options, bounds = self.limits.options(), {}
        else:
            options = f"{self.limits.options()} {silence.server_options(self.server_version)}"
            bounds = silence.client_parameters()
        conninfo = psycopg.conninfo.make_conninfo(self.url, options=options, application_name=name, **bounds)
        return psycopg.connect(conninfo, autocommit=autocommit)

    def ping(self) -> bool:
        try:
            with self.connection() as conn:
                conn.execute(query("ping"))
            return True
        except psycopg.Error:
            return False
