"""A fresh machine's first run, made in a corner of this one without touching its users or its caches.

Each command runs in a mount namespace of its own whose /etc is a copy of this machine's without the embedded
PostgreSQL's OS user: what a CI container has before its first `make test`. The copy is shared by every
command of one `FreshMachine`, so a `useradd` in one is seen by the others, as on a real machine. Programs
that set the machine up (`useradd`, Maven) are recorded: a program of the same name first on PATH notes each
call's start and end and makes it last half a second longer, so that calls made at the same moment overlap
for certain and a test can count them.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

SYSTEM_USER = "embedded_postgres"
RECORDED = ("useradd", "mvn")
_ACCOUNT_FILES = ("passwd", "shadow", "group", "gshadow", "subuid", "subgid")
_RECORDING = """#!/bin/sh
echo "start $$" >> {log}
sleep 0.5
{real} "$@"
status=$?
echo "end $$ $status" >> {log}
exit $status
"""


def can_make_one() -> str | None:
    """Why a fresh machine cannot be made here (None when it can): it takes root, unshare and the recorded
    programs."""
    if os.geteuid() != 0:
        return "needs root (the embedded PostgreSQL makes an OS user only when run as root)"
    missing = [tool for tool in ("unshare", "mount", *RECORDED) if shutil.which(tool) is None]
    return f"missing {', '.join(missing)}" if missing else None


@dataclass(frozen=True)
class Call:
    pid: int
    status: int | None  # None while it runs (or when it was cut)


class FreshMachine:
    def __init__(self, root: Path):
        self.etc = root / "etc"
        shutil.copytree("/etc", self.etc, symlinks=True)
        for name in _ACCOUNT_FILES:
            _drop_user(self.etc / name)
        self.bin = root / "bin"
        self.bin.mkdir()
        self._logs = {name: root / f"{name}.log" for name in RECORDED}
        for name, log in self._logs.items():
            log.touch()
            recording = self.bin / name
            recording.write_text(_RECORDING.format(log=log, real=shutil.which(name)))
            recording.chmod(0o755)

    def command(self, argv: Sequence[str]) -> list[str]:
        """`argv` run on this fresh machine: its /etc, and the recorded programs first on PATH."""
        script = 'mount --bind "$0" /etc && PATH="$1:$PATH" && shift 2 && exec "$@"'
        return ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script,
                str(self.etc), str(self.bin), "--", *argv]  # fmt: skip

    def calls(self, program: str) -> list[Call]:
        """Each call of a recorded program, in the order they started."""
        calls: dict[int, Call] = {}
        for line in self._logs[program].read_text().splitlines():
            kind, pid, *rest = line.split()
            calls[int(pid)] = Call(int(pid), int(rest[0]) if kind == "end" else None)
        return list(calls.values())

    def knows_user(self) -> bool:
        accounts = (self.etc / "passwd").read_text().splitlines()
        return any(line.startswith(f"{SYSTEM_USER}:") for line in accounts)


def _drop_user(path: Path) -> None:
    if path.exists():
        kept = [line for line in path.read_text().splitlines() if not line.startswith(f"{SYSTEM_USER}:")]
        path.write_text("".join(f"{line}\n" for line in kept))


def stop_postmaster(pgdata: Path) -> None:
    """Stop a server however it was started: its user exists only on the fresh machine, so `pg_ctl` as this
    machine's user may not reach it; SIGINT is PostgreSQL's fast shutdown."""
    try:
        pid = int((pgdata / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return
    try:
        os.kill(pid, signal.SIGINT)
    except ProcessLookupError:
        return
    gone = f"while kill -0 {pid} 2>/dev/null; do sleep 0.05; done"
    subprocess.run(["sh", "-c", gone], timeout=30, check=False)
