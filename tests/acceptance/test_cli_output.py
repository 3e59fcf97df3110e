"""What people read: tables that keep ids and codes whole at 100 and 140 columns, the run's status as tables,
one JSON style (the HTTP API's), a terminal run that shows a progress bar rather than log lines, and help."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import select
import struct
import subprocess
import termios
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from pin_identity.composition import Container
from pin_identity.entrypoints.admin_http import create_app
from pin_identity.simulation.simulated_talent import generate_dataset
from tests.support import seed
from tests.support.cli import CLI, run_cli
from tests.support.talent_import import TalentWorld

TOKEN = "output-token"
UUID_TEXT = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


@pytest.fixture
def env(subprocess_env: dict[str, str], api_world: TalentWorld) -> dict[str, str]:
    return {
        **subprocess_env,
        "PIN_IDENTITY_TALENT_API_URL": api_world.api.url,
        "PIN_IDENTITY_TALENT_API_TOKEN": "talent-token",
        "PIN_IDENTITY_INLINE_FANOUT_THRESHOLD": "0",
    }


@pytest.fixture
def imported(api_world: TalentWorld) -> str:
    """A completed run whose quarantine holds each kind of poison (the longest code included)."""
    api_world.publish(generate_dataset(6, 30, seed=51, poison=True))
    return str(api_world.run(page_size=5).run_id)


@pytest.fixture
def api(api_world: TalentWorld) -> Iterator[TestClient]:
    container = Container(api_world.container.settings.model_copy(update={"admin_token": TOKEN}))
    try:
        with TestClient(create_app(container), headers={"Authorization": f"Bearer {TOKEN}"}) as client:
            yield client
    finally:
        container.close()


def _queued_task(env: dict[str, str], world: TalentWorld) -> None:
    company_id = seed.company(world.container.stores.identity_transactions)
    role_id = seed.role(world.container.stores.identity_transactions, company_id)
    seed.grant(
        world.container.stores.identity_transactions,
        seed.user(world.container.stores.identity_transactions),
        role_id,
        company_id,
    )
    assert run_cli(env, "roles", "set-permissions", str(role_id), "deals.read").returncode == 0


def _at(env: dict[str, str], columns: int, *args: str) -> str:
    result = run_cli({**env, "COLUMNS": str(columns)}, *args)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def _whole_on_a_line(output: str, values: list[str]) -> None:
    lines = output.splitlines()
    for value in values:
        assert any(value in line for line in lines), f"{value} is cut:\n{output}"


# ---------------------------------------------------------------- tables


@pytest.mark.parametrize("columns", [100, 140])
def test_ids_and_codes_are_never_cut(
    env: dict[str, str], api_world: TalentWorld, imported: str, columns: int
) -> None:
    _queued_task(env, api_world)
    tasks = json.loads(_at(env, columns, "fanout", "list", "--json"))
    items = json.loads(_at(env, columns, "talent-import", "failed-items", imported, "--json"))
    assert tasks and len(items) == 4

    listed = _at(env, columns, "fanout", "list")
    _whole_on_a_line(listed, [value for t in tasks for value in (t["taskId"], t["roleId"])])
    quarantine = _at(env, columns, "talent-import", "failed-items", imported)
    values = [i[key] for i in items for key in ("itemId", "externalId", "errorCode")]
    _whole_on_a_line(quarantine, values)
    assert "IDENTITY_SYNC_UNKNOWN_COMPANY_TYPE" in values and "…" not in listed + quarantine
    assert max(len(line) for line in (listed + quarantine).splitlines()) <= columns
    if columns == 140:  # wide enough for the table: a task's ids side by side
        assert any(tasks[0]["taskId"] in line and tasks[0]["roleId"] in line for line in listed.splitlines())


def test_status_is_tables_without_python_reprs(env: dict[str, str], imported: str) -> None:
    status = _at(env, 100, "talent-import", "status", imported)
    assert imported in status and "Completed" in status
    for repr_text in ("{'", "None", "True", "False"):
        assert repr_text not in status
    assert re.search(r"users\s+33\s+30\s+0\s+3", status.replace(",", ""))  # 30 users + 3 poisoned
    assert re.search(r"Tenants\s+0\s+0\s+\d+\s+0", status)


# ---------------------------------------------------------------- one JSON style: the HTTP API's


def test_json_is_the_http_apis_documents(
    env: dict[str, str], api_world: TalentWorld, imported: str, api: TestClient
) -> None:
    _queued_task(env, api_world)
    runs = "/admin/v1/talent-import/runs"
    pairs: list[tuple[Any, Any]] = [
        (
            json.loads(_at(env, 100, "fanout", "list", "--json")),
            api.get("/admin/v1/access-fanout/tasks").json(),
        ),
        (
            json.loads(_at(env, 100, "talent-import", "failed-items", imported, "--json")),
            api.get(f"{runs}/{imported}/failed-items").json(),
        ),
    ]
    for printed, answered in pairs:
        assert printed == answered
    status = json.loads(_at(env, 100, "talent-import", "status", imported, "--json"))
    assert status == api.get(f"{runs}/{imported}").json() | {"lockHolder": status["lockHolder"]}
    stamps = [status["startedAt"], *(item["createdAt"] for item in pairs[1][0])]
    stamps += [task["createdAt"] for task in pairs[0][0]]
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)", s) for s in stamps)
    assert all("_" not in key for document in pairs[0][0] for key in document)


# ---------------------------------------------------------------- a run on a terminal


def _on_a_terminal(env: dict[str, str], *args: str, columns: int = 100) -> tuple[int, str]:
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
    terminal_env = {k: v for k, v in env.items() if k != "PIN_IDENTITY_LOG_FORMAT"}
    process = subprocess.Popen(
        [*CLI, *args],
        env={**terminal_env, "TERM": "xterm", "COLUMNS": str(columns)},
        stdin=follower,
        stdout=follower,
        stderr=follower,
    )
    os.close(follower)
    screen = bytearray()
    while True:
        ready, _, _ = select.select([leader], [], [], 0.2)
        try:
            chunk = os.read(leader, 65536) if ready else b""
        except OSError:  # the terminal's other end closed
            break
        if ready and not chunk:
            break
        screen += chunk
        if not ready and process.poll() is not None:
            break
    os.close(leader)
    return process.wait(timeout=60), ANSI.sub("", screen.decode(errors="replace"))


def test_a_run_on_a_terminal_shows_a_progress_bar_with_the_real_totals(
    env: dict[str, str], api_world: TalentWorld
) -> None:
    api_world.publish(generate_dataset(12, 60, seed=52))
    status, screen = _on_a_terminal(env, "talent-import", "run", "--mode", "api-pull", "--page-size", "4")

    assert status == 0, screen[-3000:]
    [(tenants, users)] = _pages(api_world)
    frames = [frame.strip() for frame in re.split(r"[\r\n]+", screen) if frame.strip()]
    last = {
        stage: [f for f in frames if f.startswith(f"{stage} pages")][-1] for stage in ("Tenants", "Users")
    }
    assert re.search(rf"\b{tenants}/{tenants}\b", last["Tenants"]), last
    assert re.search(rf"\b{users}/{users}\b", last["Users"]), last
    logged = [f for f in frames if "[info" in f or f.startswith("{")]
    assert [line for line in logged if "admin-action" not in line] == []  # no page or planning lines
    assert "Completed" in screen


def _pages(world: TalentWorld) -> list[tuple[int, int]]:
    with world.container.connections.database.connection() as conn:
        return conn.execute(
            "SELECT count(*) FILTER (WHERE stage = 'Tenants'), count(*) FILTER (WHERE stage = 'Users')"
            " FROM identity.talent_import_pages"
        ).fetchall()


# ---------------------------------------------------------------- help


def test_help_shows_flags_as_flags_and_the_modes(env: dict[str, str]) -> None:
    run_help = _at(env, 100, "talent-import", "run", "--help")
    assert "<bool>" not in run_help
    assert re.search(r"--dry-run\s+Count only", run_help)
    assert "--mode <api-pull|topic-replay>" in run_help
    assert re.search(r"--correlation-id <UUID>\s+\S", run_help)  # it has help text
    for group in (("fanout", "list"), ("talent-import", "failed-items"), ("maintenance", "prune")):
        assert "<bool>" not in _at(env, 100, *group, "--help")
