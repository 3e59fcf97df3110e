"""Each test session's files in a directory of its own, outside pytest's `pytest-of-<user>`.

Run as root, the embedded PostgreSQL runs as an OS user of its own, which must be able to walk down to its
data directory; starting a server opens every directory above it to others (read and search, no write).
pytest sets `pytest-of-<user>` back to 0700 whenever a session starts, so a second session on the machine
(another checkout's `make test`, one test run beside the suite) cut every running server of the first off its
data: all of that session's database tests failed at once. A session's base directory here is made by
mkdtemp (0700, a name nobody can guess) and left alone by other sessions; each holds a lock on its own while
it runs, and the next sessions remove those whose lock is free, keeping the newest few for a look after a
failure.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
from pathlib import Path

_PREFIX = "pin-identity-tests-"
_KEEP = 3  # finished sessions kept, as pytest keeps its own
_IN_USE = ".in-use"


def new_basetemp() -> Path:
    """The session's base directory for pytest (`--basetemp`: pytest makes it afresh), in a directory held
    until this process ends; finished sessions' beyond the newest few go."""
    root = Path(tempfile.gettempdir())
    _remove_finished(root)
    made = Path(tempfile.mkdtemp(prefix=_PREFIX, dir=root))
    handle = os.open(made / _IN_USE, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    fcntl.flock(handle, fcntl.LOCK_EX)  # kept open (and locked) for the life of this process
    return made / "tmp"


def _remove_finished(root: Path) -> None:
    mine = [path for path in root.glob(f"{_PREFIX}*") if _owned(path)]
    finished = [path for path in mine if not _in_use(path)]
    finished.sort(key=lambda path: path.stat().st_mtime, reverse=True)
    for path in finished[_KEEP:]:
        shutil.rmtree(path, ignore_errors=True)


def _owned(path: Path) -> bool:
    with contextlib.suppress(OSError):
        return path.is_dir() and not path.is_symlink() and path.stat().st_uid == os.geteuid()
    return False


def _in_use(path: Path) -> bool:
    try:
        handle = os.open(path / _IN_USE, os.O_RDWR | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(handle)
    return False
