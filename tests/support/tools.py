"""Programs some tests drive (a browser, promtool) that `make test` installs from Debian packages."""

from __future__ import annotations

import shutil


def installed_tool(name: str, package: str) -> str:
    """The program's path; a test without it fails saying how to install it."""
    path = shutil.which(name)
    assert path, (
        f"{name} is missing: `make test` installs it (Debian package `{package}`); "
        f"or run `apt-get install --no-install-recommends {package}`"
    )
    return path
