"""Locks between the processes of one machine (a file's flock), for what they set up once and share: the
embedded servers' homes, the Kafka release in the cache, the embedded PostgreSQL's OS user."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

# Where a lock of the whole machine lives: the system's lock directory (Debian's /run/lock, a tmpfs every user
# may write), /tmp where there is none. Never $TMPDIR: two processes with different ones would not meet.
MACHINE_LOCKS = next(
    (Path(folder) for folder in ("/run/lock", "/var/lock") if Path(folder).is_dir()),
    Path("/tmp"),  # noqa: S108 - opened without following a symlink (exclusive)
)


@contextlib.contextmanager
def exclusive(path: Path) -> Iterator[None]:
    """Held by one process at a time until the block ends (or the process does: the kernel drops it). The
    file is never followed through a symlink, so another user cannot point root's lock at a file of theirs."""
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield
    finally:
        os.close(descriptor)
