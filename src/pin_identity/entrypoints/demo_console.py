"""`pin-identity demo --keep-running` leaves `serve` running beside the embedded servers, so that the operator
console (`/ui/`) shows what the demo did. `pin-identity embedded stop` stops it with them.

Its admin token is PIN_IDENTITY_ADMIN_TOKEN when set; otherwise a new one, written to a file of the data dir
that only its owner can read (the terminal shows how to read it, not the token itself).
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
from rich.console import Console

from pin_identity.composition.embedded_servers import local_port
from pin_identity.config import ConfigurationError, Settings
from pin_identity.domain.clock import Clock
from pin_identity.processes import command_line_holds

PREFERRED_PORT = 8080  # serve's own default
START_TIMEOUT_S = 30.0
TOKEN_FILE = "console-token"  # noqa: S105 - the name of the file, not a token
PID_FILE = "console.pid"
LOG_FILE = "console.log"


@dataclass(frozen=True)
class RunningConsole:
    url: str
    pid: int
    token_file: Path | None  # None: the token is PIN_IDENTITY_ADMIN_TOKEN
    log_file: Path


def start_console(settings: Settings, clock: Clock) -> RunningConsole:
    """Start `serve` in a session of its own (it outlives this command) and wait until it answers."""
    data_dir = settings.data_dir.resolve()
    stop_console(data_dir)  # the one a previous demo left, with its token
    token, token_file = _token(settings, data_dir)
    port = local_port(PREFERRED_PORT)
    log_file = data_dir / LOG_FILE
    with log_file.open("ab") as log:
        server = subprocess.Popen(
            [sys.executable, "-m", "pin_identity.entrypoints.cli", "serve", "--port", str(port)],
            env={**os.environ, "PIN_IDENTITY_ADMIN_TOKEN": token},
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
    (data_dir / PID_FILE).write_text(f"{server.pid}\n", encoding="utf-8")
    base = f"http://127.0.0.1:{port}"
    _wait_until_serving(server, base, log_file, clock)
    return RunningConsole(f"{base}/ui/", server.pid, token_file, log_file)


def _token(settings: Settings, data_dir: Path) -> tuple[str, Path | None]:
    if settings.admin_token and settings.admin_token.strip():
        return settings.admin_token, None
    token_file = data_dir / TOKEN_FILE
    token_file.unlink(missing_ok=True)
    token = secrets.token_urlsafe(24)
    descriptor = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as written:
        written.write(f"{token}\n")
    return token, token_file


def _wait_until_serving(server: subprocess.Popen[bytes], base: str, log_file: Path, clock: Clock) -> None:
    deadline = clock.monotonic() + START_TIMEOUT_S
    while clock.monotonic() < deadline:
        if server.poll() is not None:
            raise ConfigurationError(f"serve stopped at start (exit {server.returncode}); see {log_file}")
        try:
            if httpx.get(f"{base}/healthz", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass  # still starting
        time.sleep(0.2)
    raise ConfigurationError(f"serve did not answer within {START_TIMEOUT_S:g} s; see {log_file}")


def stop_console(data_dir: Path) -> bool:
    """Stop the `serve` a demo left running under this data dir; True when one was stopped."""
    pid_file = data_dir.resolve() / PID_FILE
    try:
        pid = int(pid_file.read_text(encoding="utf-8").strip())
    except (OSError, ValueError):
        return False
    pid_file.unlink(missing_ok=True)
    if not command_line_holds(pid, b"pin_identity.entrypoints.cli\x00serve"):
        return False  # long gone, and the pid maybe another process's by now
    os.kill(pid, signal.SIGTERM)
    return True


def print_console(running: RunningConsole, console: Console) -> None:
    token = (
        "the value of PIN_IDENTITY_ADMIN_TOKEN" if running.token_file is None else f"cat {running.token_file}"
    )
    lines = (
        "",
        f"operator console  {running.url}",
        f"token             {token}",
        f"serve             pid {running.pid}, log {running.log_file}",
        "stop it           pin-identity embedded stop (stops the embedded servers too)",
    )
    for line in lines:  # paths whole, never wrapped or read as markup: they are copied from here
        console.print(line, soft_wrap=True, markup=False, highlight=False)
