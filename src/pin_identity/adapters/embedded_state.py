"""Where the embedded PostgreSQL and broker of a data dir are, and whether they run (`embedded info`).

It only looks (the servers' state files, a connection attempt): nothing is started. The next command that
needs a server starts it, the way every command does.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from pin_identity.adapters.kafka.embedded import HOST, port_open
from pin_identity.adapters.postgres.embedded import DATABASE_NAME


@dataclass(frozen=True)
class EmbeddedServer:
    address: str | None  # None until the server has been started once under this data dir
    running: bool
    pid: int | None
    in_use: bool  # False when a URL is configured: commands then never touch this server
    log_file: Path

    def as_json(self, address_key: str) -> dict[str, Any]:
        return {
            address_key: self.address,
            "running": self.running,
            "pid": self.pid,
            "inUse": self.in_use,
            "logFile": str(self.log_file),
        }

    def state(self, variable: str) -> str:
        """One line: running where, or why not; `variable` is the setting that makes it unused."""
        usage = "" if self.in_use else f" (not used: {variable} is set)"
        if self.running:
            return f"running   {self.address}   pid {self.pid}{usage}"
        if self.address is None:  # never started here, or stopped by `embedded stop`
            return f"not running{usage or ' (the next command that needs it starts it)'}"
        return f"not running (last at {self.address}; see {self.log_file}){usage}"


def embedded_postgres_state(data_dir: Path, in_use: bool) -> EmbeddedServer:
    pgdata = data_dir / "postgres"
    log_file = pgdata / "log"
    try:  # PostgreSQL's own record of a started server: pid, data dir, start time, port, socket dir, ...
        fields = (pgdata / "postmaster.pid").read_text(encoding="utf-8").splitlines()
    except OSError:
        return EmbeddedServer(None, False, None, in_use, log_file)
    pid, port, socket_dir = int(fields[0]), fields[3].strip(), fields[4].strip()
    # The URL the commands use (embedded_postgres: a Unix socket, user postgres, trust, the default port).
    url = f"postgresql://postgres:@/{DATABASE_NAME}?host={socket_dir}"
    if port != "5432":
        url += f"&port={port}"
    return EmbeddedServer(url, _accepts_connections(url), pid, in_use, log_file)


def _accepts_connections(url: str) -> bool:
    try:
        with psycopg.connect(url, connect_timeout=3):
            return True
    except psycopg.Error:
        return False


def embedded_broker_state(data_dir: Path, in_use: bool) -> EmbeddedServer:
    state_file = data_dir / "kafka" / "broker.json"
    log_file = state_file.with_name("broker.log")
    try:
        state = json.loads(state_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return EmbeddedServer(None, False, None, in_use, log_file)
    pid, port = int(state["pid"]), int(state["port"])
    running = Path(f"/proc/{pid}").exists() and port_open(port)
    return EmbeddedServer(f"{HOST}:{port}", running, pid, in_use, log_file)
