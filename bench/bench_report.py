"""What the benchmarks report beside their figures: the machine, its load, nearest-rank percentiles."""

from __future__ import annotations

import contextlib
import math
import os
import platform
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest rank: the smallest value with at least q of all values at or below it."""
    ordered = sorted(values)
    return ordered[max(math.ceil(q * len(ordered)) - 1, 0)]


def loadavg() -> str:
    """The 1, 5 and 15 minute load averages: the machine is shared, so each report says what else ran."""
    with contextlib.suppress(OSError):
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    return "unknown"


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "cpu"


def machine_line() -> str:
    """The machine in a few words, for a report's first lines."""
    return f"{platform.machine()}, {os.cpu_count()} cores, python {platform.python_version()}"


def machine(admin_url: str) -> dict[str, Any]:
    """The machine and the PostgreSQL server a report's figures were measured on."""
    with psycopg.connect(admin_url) as conn:
        row = conn.execute("SHOW server_version").fetchone()
    return {
        "arch": platform.machine(),
        "processor": cpu_model(),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "postgres": row[0] if row else "unknown",
        "system": f"{platform.system()} {platform.release()}",
    }
