"""This process's claim holder: a session of its own that holds an advisory lock on a key of its own for as
long as the process and its path to the server live. A claim (a fan-out task, an import page) records the
key (`holder_key`), and a claim whose holder's lock is gone is taken over at once, not when its lease runs
out (`identity.claim_holder_gone`, migration 0009): a worker killed mid-task (an OOM kill, a lost node)
ends its session with it, so its task waits seconds for a new holder, not the five minutes of a lease.

Why a lock rather than the backend's pid checked against pg_stat_activity: a pid is reused by the server,
and pg_stat_activity hides other roles' sessions from a role without pg_read_all_stats, while pg_locks shows
every role's locks. A live holder keeps its lock, so a slow one still keeps its lease and is fenced by it;
one whose session dropped while it lives (a network blip) has lost its lock, its claims are taken over,
and its next write is fenced (the claim id no longer matches). It takes a new key on its next claim."""

from __future__ import annotations

import os
import secrets
import socket
import threading
from collections.abc import Callable

import psycopg

from pin_identity.adapters.postgres.catalogue import query

# The first key of every holder lock (pg_advisory_lock(int, int), objsubid 2 in pg_locks), apart from the
# relay's and the import run's single-key locks. Migration 0009's function names the same number.
HOLDER_LOCK_SPACE = 1_885_957_632
_LARGEST_KEY = 2**31 - 1  # an int4, positive: pg_locks shows it as the same number (an oid)


def holder_session_name() -> str:
    """What pg_stat_activity shows for the session: which process holds the claims."""
    return f"pin-identity holder {socket.gethostname()} pid {os.getpid()}"[:63]


class HolderSession:
    """Opened on the first claim; `key()` checks the session still lives (one round trip) and takes a new
    session and key when it does not. Several jobs of one worker claim from their own threads."""

    def __init__(self, connect: Callable[[], psycopg.Connection]):
        self._connect = connect
        self._conn: psycopg.Connection | None = None
        self._key = 0
        self._lock = threading.Lock()

    def key(self) -> int:
        with self._lock:
            if self._conn is None or not self._alive(self._conn):
                self._take()
            return self._key

    def close(self) -> None:
        with self._lock:
            self._drop()

    def _take(self) -> None:
        self._drop()
        conn = self._connect()
        try:
            while True:  # another live holder has this key: draw again
                key = secrets.randbelow(_LARGEST_KEY) + 1
                params = {"space": HOLDER_LOCK_SPACE, "key": key}
                [(taken,)] = conn.execute(query("take_holder_lock"), params).fetchall()
                if taken:
                    break
        except BaseException:
            conn.close()
            raise
        self._conn, self._key = conn, key

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()  # the session ends, and the lock with it

    @staticmethod
    def _alive(conn: psycopg.Connection) -> bool:
        try:
            conn.execute(query("ping"))
        except psycopg.Error:
            return False
        return True
