"""This machine's processes, as Linux shows them under /proc: which program a pid runs. It sits beside the
layers, so the entry points and the adapters that start servers ask the same question the same way."""

from __future__ import annotations

from pathlib import Path


def command_line_holds(pid: int, part: bytes) -> bool:
    """Whether `pid` is a live process whose command line (its arguments joined by NUL bytes) holds `part`. A
    pid written down long ago may be another program's by now, and a zombie's command line reads empty."""
    try:
        return part in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
