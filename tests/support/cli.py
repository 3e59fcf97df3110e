"""The `pin-identity` command as a subprocess, the way operators and deployments run it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import httpx

from pin_identity.adapters.kafka.embedded_kafka import free_port
from tests.support.health import wait_for_healthz

CLI = [sys.executable, "-m", "pin_identity.entrypoints.cli"]


def unconfigured_environment() -> dict[str, str]:
    """This process's environment without PIN_IDENTITY_ settings: a command sees only what the test adds."""
    return {k: v for k, v in os.environ.items() if not k.startswith("PIN_IDENTITY_")}


def run_cli(
    env: dict[str, str], *args: str, timeout: float = 60, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
    )


class WorkerProcess(NamedTuple):
    """`pin-identity worker` as a process of its own."""

    base: str  # its HTTP port's URL: /healthz, /readyz, /metrics
    process: subprocess.Popen[bytes]
    log: Path  # its stderr: one JSON object a line

    def ready(self) -> int:
        """The status /readyz answers."""
        return httpx.get(f"{self.base}/readyz", timeout=5).status_code

    def stop(self, timeout_s: float = 60) -> int:
        """SIGTERM (after SIGCONT, should the test have frozen it); its exit status."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
            self.process.terminate()
        return self.process.wait(timeout_s)


def launch_worker(env: dict[str, str], jobs: str, log: Path, *, timeout_s: float = 30) -> WorkerProcess:
    """`worker --jobs JOBS` on a free HTTP port, its stderr written to `log`; returned once it answers
    /healthz (killed if it never does)."""
    port = free_port()
    with log.open("wb") as stderr:
        process = subprocess.Popen(
            [*CLI, "worker", "--jobs", jobs],
            env={**env, "PIN_IDENTITY_WORKER_HTTP_PORT": str(port)},
            stderr=stderr,
        )
    worker = WorkerProcess(f"http://127.0.0.1:{port}", process, log)
    try:
        wait_for_healthz(worker.base, f"worker --jobs {jobs}", timeout_s=timeout_s)
    except BaseException:
        process.kill()
        process.wait()
        raise
    return worker
