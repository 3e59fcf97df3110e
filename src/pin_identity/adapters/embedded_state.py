"""Where the embedded PostgreSQL and broker of a data dir are, and whether they run (`embedded info`).

It only looks (the servers' state files, a connection attempt): nothing is started. The next command that
needs a server starts it, the way every command does.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import psycopg

from pin_identity.adapters.kafka.distribution import KAFKA_VERSION
from pin_identity.adapters.kafka.embedded_kafka import HOST, is_broker, port_open, read_broker_state
from pin_identity.adapters.postgres.embedded_postgres import DATABASE_NAME


@dataclass(frozen=True)
class EmbeddedServer:
    software: str  # what runs there, with its version ("Apache Kafka 4.2.1")
    address: str | None  # None until the server has been started once under this data dir
    running: bool
    pid: int | None
    in_use: bool  # False when a URL is configured: commands then never touch this server
    log_file: Path

    def state(self, variable: str) -> str:
        """One line: running where, or why not; `variable` is the setting that makes it unused."""
        usage = "" if self.in_use else f" (not used: {variable} is set)"
        if self.running:
            return f"running   {self.address}   pid {self.pid}   {self.software}{usage}"
        if self.address is None:  # never started here
            return f"not running{usage or ' (the next command that needs it starts it)'}"
        return f"not running (last at {self.address}; see {self.log_file}){usage}"


def embedded_postgres_state(data_dir: Path, in_use: bool) -> EmbeddedServer:
    pgdata = data_dir / "postgres"
    log_file = pgdata / "log"
    software = _postgres_software(pgdata)
    try:  # PostgreSQL's own record of a started server: pid, data dir, start time, port, socket dir, ...
        fields = (pgdata / "postmaster.pid").read_text(encoding="utf-8").splitlines()
    except OSError:
        return EmbeddedServer(software, None, False, None, in_use, log_file)
    pid, port, socket_dir = int(fields[0]), fields[3].strip(), fields[4].strip()
    # The URL the commands use (embedded_postgres: a Unix socket, user postgres, trust, the default port).
    url = f"postgresql://postgres:@/{DATABASE_NAME}?host={socket_dir}"
    if port != "5432":
        url += f"&port={port}"
    return EmbeddedServer(software, url, _accepts_connections(url), pid, in_use, log_file)


def _postgres_software(pgdata: Path) -> str:
    """The major version the data directory was made by (PG_VERSION), the one a running server has."""
    try:
        return f"PostgreSQL {(pgdata / 'PG_VERSION').read_text(encoding='utf-8').strip()}"
    except OSError:
        return "PostgreSQL"


def _accepts_connections(url: str) -> bool:
    try:
        with psycopg.connect(url, connect_timeout=3):
            return True
    except psycopg.Error:
        return False


def embedded_broker_state(data_dir: Path, in_use: bool) -> EmbeddedServer:
    log_file = data_dir / "kafka" / "broker.log"
    software = f"Apache Kafka {KAFKA_VERSION}"
    state = read_broker_state(data_dir)
    if state is None:
        return EmbeddedServer(software, None, False, None, in_use, log_file)
    pid, port = state["pid"], state["port"]
    running = is_broker(pid) and port_open(port)
    return EmbeddedServer(software, f"{HOST}:{port}", running, pid, in_use, log_file)
