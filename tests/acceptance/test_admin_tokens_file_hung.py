"""The admin API never waits on its tokens file: a read that hangs (a network mount gone silent) stalls no
request, `/healthz` and `/readyz` answer, and the operators of the last file that loaded stay in force while
`/readyz` and `/metrics` say the file cannot be read."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tests.support.cli import CLI
from tests.support.health import metric, wait_for_healthz
from tests.support.operators import bearer, write_tokens_file
from tests.support.waiting import first_answer

pytestmark = pytest.mark.timeout(120)

# A request that waited on the file would wait as long as the mount hangs: answered within this, it did not.
PROMPT_S = 3.0


def _timed(ask: str, base: str, **headers: str) -> tuple[httpx.Response, float]:
    started = time.monotonic()
    answer = httpx.get(f"{base}{ask}", headers=headers, timeout=10)
    return answer, time.monotonic() - started


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_a_tokens_file_whose_read_hangs_blocks_no_request_and_the_last_operators_stay(
    subprocess_env: dict[str, str], tmp_path: Path
) -> None:
    tokens = write_tokens_file(tmp_path / "operators", {"alice": ("operator", "alice-1")})
    port = _free_port()
    env = {**subprocess_env, "PIN_IDENTITY_ADMIN_TOKENS_FILE": str(tokens)}
    log = tmp_path / "serve.log"
    with log.open("w") as stderr:
        server = subprocess.Popen([*CLI, "serve", "--port", str(port)], env=env, stderr=stderr)
    hung = tmp_path / "hung"
    try:
        base = f"http://127.0.0.1:{port}"
        wait_for_healthz(base, "serve")
        assert httpx.get(f"{base}/admin/v1/whoami", headers=bearer("alice-1"), timeout=5).status_code == 200

        # The file becomes one whose read never ends: a FIFO nobody writes to blocks its reader in open(), as
        # a read from a hung network mount blocks.
        os.mkfifo(hung)
        os.replace(hung, tokens)

        def warned() -> list[str] | None:
            answer, took = _timed("/readyz", base)
            assert took < PROMPT_S, f"/readyz took {took:.1f} s"
            assert answer.status_code == 200, answer.text
            warnings = [w for w in answer.json()["warnings"] if "PIN_IDENTITY_ADMIN_TOKENS_FILE" in w]
            return warnings or None

        [warning] = first_answer(warned, "/readyz says the tokens file does not answer", timeout_s=30)
        assert "did not answer within" in warning and "the operators last loaded stay in force" in warning

        for ask, headers in (
            ("/admin/v1/whoami", bearer("alice-1")),
            ("/admin/v1/access-fanout/tasks", bearer("alice-1")),
            ("/healthz", {}),
            ("/readyz", {}),
        ):
            answer, took = _timed(ask, base, **headers)
            assert answer.status_code == 200 and took < PROMPT_S, (ask, answer.status_code, took)
        assert httpx.get(f"{base}/admin/v1/whoami", headers=bearer("nobody"), timeout=5).status_code == 401
        scrape, took = _timed("/metrics", base)
        assert took < PROMPT_S and metric(scrape.text, "identity_admin_tokens_file_load_error") == 1
    finally:
        # Whatever reads the FIFO is let go (a writer appears and goes), then the server stops.
        with contextlib.suppress(OSError):
            os.close(os.open(tokens, os.O_WRONLY | os.O_NONBLOCK))
        server.kill()
        server.wait(timeout=30)
    logged = log.read_text()
    assert '"event": "admin-operators-file-unanswered"' in logged
