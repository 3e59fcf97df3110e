"""The `pin-identity` command as a subprocess, the way operators and deployments run it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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
