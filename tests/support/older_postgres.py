"""A PostgreSQL server of a major older than the embedded one (18), from Debian's packages, for what differs
between majors: pg_dump 15-17 reads each sequence inside its one transaction, 18's does not. `make test`
installs the package when it is missing (Makefile, `tools`)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.support.certificates import ServerCertificate

# The majors CONTRACTS supports below the embedded server's, oldest first.
MAJORS = (15, 16, 17)
# Debian's supported major (15 on bookworm, 17 on trixie), server and client.
PACKAGE = "postgresql"
# PostgreSQL refuses to run as root: started by root, the server runs as the package's own user.
OS_USER = "postgres"


def older_postgres_bin() -> Path:
    """The bin directory of the oldest major installed; skips when missing and not root (fails as root,
    where `make tools` installs it)."""
    for major in MAJORS:
        bindir = Path(f"/usr/lib/postgresql/{major}/bin")
        if all((bindir / program).exists() for program in ("initdb", "pg_ctl", "pg_dump")):
            return bindir
    missing = (
        f"no PostgreSQL {MAJORS[0]}-{MAJORS[-1]} under /usr/lib/postgresql: `make tools` installs it "
        f"(Debian package `{PACKAGE}`), or run `apt-get install --no-install-recommends {PACKAGE}`"
    )
    if os.geteuid() != 0:
        pytest.skip(missing)
    pytest.fail(missing)


def _tls_options(workdir: Path, tls: ServerCertificate) -> str:
    """The certificate and its key copied where the server's user reads them (the key 0600, its own)."""
    for source, name in ((tls.certificate, "server.crt"), (tls.key, "server.key")):
        shutil.copy(source, workdir / name)
        (workdir / name).chmod(0o600)
        if os.geteuid() == 0:
            shutil.chown(workdir / name, OS_USER, OS_USER)
    return f"-c ssl=on -c ssl_cert_file={workdir / 'server.crt'} -c ssl_key_file={workdir / 'server.key'}"


def _as_server_user() -> dict[str, Any]:
    return {"user": OS_USER, "group": OS_USER, "extra_groups": []} if os.geteuid() == 0 else {}


@contextmanager
def older_postgres(bindir: Path, *, tls: ServerCertificate | None = None, port: int = 0) -> Iterator[str]:
    """A fresh server on a Unix socket, stopped and removed after the block; yields its admin URL (the
    socket, trusted). With `tls`, it also listens on 127.0.0.1:`port` for TLS with that certificate, where
    a password is asked (scram-sha-256), as a production server does."""
    # Under /tmp, not pytest's tmp_path: the server's user must reach it, and root's pytest folders are 0700.
    workdir = Path(tempfile.mkdtemp(prefix="pin-identity-older-pg-"))
    if os.geteuid() == 0:
        shutil.chown(workdir, OS_USER, OS_USER)
    pgdata, user = workdir / "data", _as_server_user()
    settings = "-c fsync=off -c synchronous_commit=off -c full_page_writes=off"  # as the embedded test server
    listen = f"-h '' -k {workdir}"
    if tls is not None:
        listen = f"-h 127.0.0.1 -p {port} -k {workdir} {_tls_options(workdir, tls)}"
    try:
        subprocess.run(
            [bindir / "initdb", "-D", pgdata, "--auth-local=trust", "--auth-host=scram-sha-256",
             "-U", "postgres", "-E", "UTF8", "-N"],
            check=True, capture_output=True, cwd=workdir, **user,
        )  # fmt: skip
        subprocess.run(
            [bindir / "pg_ctl", "-D", pgdata, "-w", "-l", workdir / "log", "start",
             "-o", f"{listen} {settings}"],
            check=True, capture_output=True, cwd=workdir, **user,
        )  # fmt: skip
        yield f"postgresql://postgres@/postgres?host={workdir}&port={port or 5432}"
    finally:
        if (pgdata / "postmaster.pid").exists():
            subprocess.run(
                [bindir / "pg_ctl", "-D", pgdata, "-m", "immediate", "stop"],
                check=False, capture_output=True, cwd=workdir, **user,
            )  # fmt: skip
        shutil.rmtree(workdir, ignore_errors=True)
