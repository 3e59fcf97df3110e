"""The operator console (`GET /ui/`) in a real browser: Debian's headless `chromium`, driven by Playwright,
against a real `pin-identity serve` on the test database and broker, with data made by the real use cases.
`serve` has three operators: `admin` (PIN_IDENTITY_ADMIN_TOKEN), and a viewer and an operator of its tokens
file; a viewer is offered no action, and no page asks another host for anything.

Each test clicks through one section and saves screenshots of it at 1280 and 800 px under
test-artifacts/console/. chromium is a requirement of `make test` (its `tools` target installs the Debian
package): a missing browser fails these tests rather than skipping them.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import psycopg
import pytest
from playwright.sync_api import Browser, Page, Request, expect, sync_playwright

from pin_identity.adapters.kafka.embedded_kafka import free_port, port_open
from pin_identity.adapters.postgres.import_store import PostgresImportStore
from pin_identity.adapters.system_clock import SYSTEM_CLOCK
from pin_identity.composition import Container
from pin_identity.domain.fanout_policy import FanOutPolicy
from pin_identity.domain.import_run import ImportRun, PageStatus, RunStatus
from pin_identity.jobs.talent_import import TalentImportJob
from pin_identity.operations import identity_changes
from pin_identity.simulation.simulated_talent import TalentDataset, generate_dataset
from tests.support import seed, talent
from tests.support.cli import CLI, run_cli
from tests.support.health import wait_for_healthz
from tests.support.operators import bearer, write_tokens_file
from tests.support.relay import publish_outbox
from tests.support.talent_import import TalentWorld, job
from tests.support.tools import installed_tool
from tests.support.waiting import wait_until

TOKEN = "console-test-token"  # PIN_IDENTITY_ADMIN_TOKEN: the operator `admin`
OPERATOR_TOKEN, VIEWER_TOKEN = "olga-console-token", "victor-console-token"
OPERATORS = {"olga": ("operator", OPERATOR_TOKEN), "victor": ("viewer", VIEWER_TOKEN)}
SERVE = [*CLI, "serve"]
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "console"
WIDTHS = (1280, 800)
# Roles of more users than this go through the fan-out queue: a role of 2 is queued, a role of 1 inline.
INLINE_THRESHOLD = 1
HOSTILE_NAME = '<img src=x onerror="document.title=1">Sales & <b>marketing</b>'

expect.set_options(timeout=10_000)


# ---------------------------------------------------------------- the browser and the server


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=installed_tool("chromium", "chromium"), headless=True
        )
        yield launched
        launched.close()


@dataclass(frozen=True)
class Console:
    base: str
    log: Path
    world: TalentWorld

    @property
    def url(self) -> str:
        return f"{self.base}/ui/"

    @property
    def container(self) -> Container:
        return self.world.container


@pytest.fixture
def console(subprocess_env: dict[str, str], api_world: TalentWorld, tmp_path: Path) -> Iterator[Console]:
    """`serve` in its own process, reading the same Talent (API and topics) as the test's world."""
    port = free_port()
    env = {
        **subprocess_env,
        "PIN_IDENTITY_ADMIN_TOKEN": TOKEN,
        "PIN_IDENTITY_ADMIN_TOKENS_FILE": str(write_tokens_file(tmp_path / "operators", OPERATORS)),
        "PIN_IDENTITY_TALENT_API_URL": api_world.api.url,
        "PIN_IDENTITY_TALENT_API_TOKEN": "talent-token",
        "PIN_IDENTITY_TALENT_TENANTS_TOPIC": api_world.topics.tenants,
        "PIN_IDENTITY_TALENT_USERS_TOPIC": api_world.topics.users,
        "PIN_IDENTITY_TALENT_SYNC_GROUP": api_world.topics.group,
        "PIN_IDENTITY_INLINE_FANOUT_THRESHOLD": str(INLINE_THRESHOLD),
    }
    log = tmp_path / "serve.log"
    with log.open("w") as stderr:
        server = subprocess.Popen([*SERVE, "--port", str(port)], env=env, stderr=stderr)
    try:
        base = f"http://127.0.0.1:{port}"
        wait_until(lambda: server.poll() is not None or port_open(port), "serve listens")
        assert server.poll() is None, log.read_text()
        wait_for_healthz(base, "serve")
        yield Console(base, log, api_world)
    finally:
        server.kill()
        server.wait()
    logged = log.read_text()
    assert not any(token in logged for token in (TOKEN, OPERATOR_TOKEN, VIEWER_TOKEN))


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    """A fresh tab; an uncaught script error or a refused script/style (CSP) fails the test."""
    context = browser.new_context(viewport={"width": WIDTHS[0], "height": 900})
    opened = context.new_page()
    errors: list[str] = []
    opened.on("pageerror", lambda error: errors.append(str(error)))
    # Error answers of the API (401, 409, 503) are logged by the browser as failed loads: those are expected.
    opened.on(
        "console",
        lambda message: (
            errors.append(message.text)
            if message.type == "error" and not message.text.startswith("Failed to load resource")
            else None
        ),
    )
    yield opened
    context.close()
    assert errors == []


def sign_in(page: Page, console: Console, section: str = "imports", token: str = TOKEN) -> None:
    page.goto(f"{console.url}#{section}")
    page.fill("#token-input", token)
    page.click("#token-form button[type=submit]")
    expect(page.locator("#main")).to_be_visible()
    expect(page.locator(f"#{section}")).to_be_visible()


def shoot(page: Page, name: str) -> list[Path]:
    """The page as it is, at each width; at 800 px the page itself never scrolls sideways (tables do)."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    saved = []
    for width in WIDTHS:
        page.set_viewport_size({"width": width, "height": 900})
        overflow = page.evaluate("document.documentElement.scrollWidth")
        assert overflow <= width, f"{name} at {width} px is {overflow} px wide"
        path = ARTIFACTS / f"{name}-{width}.png"
        page.screenshot(path=str(path), full_page=True)
        saved.append(path)
        print(f"screenshot: {path}")
    page.set_viewport_size({"width": WIDTHS[0], "height": 900})
    return saved


def outcome(page: Page, section: str) -> str:
    return page.locator(f"#{section}-outcome").inner_text()


# ---------------------------------------------------------------- data, through the real use cases


def poisoned_bootstrap(
    world: TalentWorld, companies: int = 4, managers: int = 12
) -> tuple[ImportRun, TalentDataset]:
    """Talent with four poison items, on its API and its topics, imported to the end: a Completed run whose
    quarantine holds the four."""
    dataset = generate_dataset(companies, managers, poison=True)
    world.publish(dataset)
    run = world.run(page_size=5)
    assert run.status is RunStatus.COMPLETED
    return run, dataset


def failed_fanout_task(container: Container, database_url: str) -> str:
    """A role of two users changed: a queued task, which then fails as the fan-out job fails a poison task
    after MaxAttempts."""
    _, role_id = seed.held_role(container.stores.identity_transactions, 2, code="poisoned-role")
    change = seed.change_permissions(
        container.stores.identity_transactions,
        role_id,
        ["deals.read", "deals.write"],
        FanOutPolicy(INLINE_THRESHOLD),  # as `serve` decides it: a role of two is queued
    )
    assert change.task_id is not None
    with psycopg.connect(database_url) as conn:
        conn.execute(
            "UPDATE identity.access_fanout_tasks SET status = 'Failed', attempt_count = 5,"
            " last_error = 'OperationalError: the broker refused the batch' WHERE id = %s",
            (change.task_id,),
        )
    return str(change.task_id)


def audit_actions(console: Console) -> list[str]:
    return re.findall(r'"action": "([a-z-]+)"', console.log.read_text())


def audit_lines(console: Console) -> list[dict[str, object]]:
    lines = (json.loads(line) for line in console.log.read_text().splitlines() if line.startswith("{"))
    return [line for line in lines if line["event"] == "admin-action"]


# ---------------------------------------------------------------- the page and the token


def test_the_page_needs_no_token_and_each_data_call_sends_it(console: Console, page: Page) -> None:
    served = httpx.get(console.url)
    assert served.status_code == 200 and served.headers["content-type"].startswith("text/html")
    assert "script-src 'self'" in served.headers["content-security-policy"]
    assert httpx.get(f"{console.base}/ui/console.js").status_code == 200
    assert httpx.get(f"{console.base}/ui/fanout_queue.sql").status_code == 404
    assert httpx.get(f"{console.base}/admin/v1/talent-import/runs").status_code == 401
    paths = set(httpx.get(f"{console.base}/openapi.json").json()["paths"])
    assert {
        "/ui/",
        "/admin/v1/talent-import/runs/{runId}/reset-leases",
        "/admin/v1/talent-import/runs/{runId}/failed-items/replay",
        "/admin/v1/roles",
        "/admin/v1/roles/{roleId}",
        "/admin/v1/health/summary",
        "/admin/v1/access/users/{userId}",
    } <= paths
    auth = {"Authorization": f"Bearer {TOKEN}"}
    for unknown in (f"talent-import/runs/{uuid.uuid4()}/reset-leases", f"roles/{uuid.uuid4()}"):
        method = "POST" if unknown.endswith("leases") else "GET"
        answer = httpx.request(method, f"{console.base}/admin/v1/{unknown}", headers=auth)
        assert answer.status_code == 404 and answer.json()["code"] == "IDENTITY_NOT_FOUND"

    page.goto(console.url)
    expect(page.locator("#welcome")).to_be_visible()
    expect(page.locator("#main")).to_be_hidden()
    page.fill("#token-input", "wrong-token")
    page.click("#token-form button[type=submit]")
    expect(page.locator("#notice")).to_contain_text("The token was refused (401 IDENTITY_UNAUTHORIZED)")
    expect(page.locator("#token-form")).to_be_visible()
    shoot(page, "sign-in")

    sign_in(page, console)
    expect(page.locator("#signed-in")).to_contain_text("Signed in as admin (operator)")
    assert page.evaluate("sessionStorage.getItem('pin-identity.admin-token')") == TOKEN
    assert page.context.cookies() == []
    page.reload()  # the tab keeps the token
    expect(page.locator("#main")).to_be_visible()
    page.click("#forget-token")
    expect(page.locator("#welcome")).to_be_visible()
    assert page.evaluate("sessionStorage.length") == 0


# ---------------------------------------------------------------- operators and their roles

ACTION_BUTTONS = {
    "Start run",
    "Cancel",
    "Reset leases",
    "Replay",
    "Replay all",
    "Replay selected",
    "Discard",
    "Edit",
}
# What each section shows once drawn, with the data of the test below.
DRAWN = {
    "imports": "#run-detail .stage",
    "quarantine": "#items-table tbody tr",
    "fanout": "#tasks-table tbody tr",
    "roles": "#roles-table tbody tr",
}


def offered_actions(page: Page) -> dict[str, list[str]]:
    """Each section's visible controls that would change something: action buttons, item checkboxes."""
    offered = {}
    for section, drawn in DRAWN.items():
        page.click(f'.tabs a[data-section="{section}"]')
        expect(page.locator(drawn).first).to_be_visible()
        shown = page.locator(f"#{section} button:visible").all_inner_texts()
        actions = sorted({label for label in shown if label in ACTION_BUTTONS})
        if page.locator(f"#{section} input.pick:visible, #q-select-all:visible").count():
            actions.append("(item checkboxes)")
        offered[section] = actions
    return offered


def test_a_viewer_is_offered_no_action_an_operator_every_one(
    console: Console, page: Page, database_url: str
) -> None:
    poisoned_bootstrap(console.world)
    _consumer_quarantine(console.container)
    task_id = failed_fanout_task(console.container, database_url)
    started = httpx.post(
        f"{console.base}/admin/v1/talent-import/runs", json={"mode": "ApiPull"}, headers=bearer(TOKEN)
    )
    assert started.status_code == 202  # Running, with no worker: Cancel and Reset leases apply

    sign_in(page, console, token=VIEWER_TOKEN)
    expect(page.locator("#operator-name")).to_have_text("victor")
    expect(page.locator("#operator-role")).to_have_text("viewer: read only")
    viewer = offered_actions(page)
    shoot(page, "viewer-roles")
    # The server decides, whatever a page offers: the viewer's token cannot act.
    refused = page.evaluate(
        """async (token) => {
            const answer = await fetch('/admin/v1/talent-sync/failed-items/replay', {
                method: 'POST', body: '{}',
                headers: {Authorization: `Bearer ${token}`, 'Content-Type': 'application/json'}});
            return [answer.status, (await answer.json()).code];
        }""",
        VIEWER_TOKEN,
    )

    page.click("#forget-token")
    sign_in(page, console, token=OPERATOR_TOKEN)
    expect(page.locator("#signed-in")).to_contain_text("Signed in as olga (operator)")
    operator = offered_actions(page)
    print(f"actions offered: viewer {viewer}; operator {operator}")
    assert viewer == {section: [] for section in DRAWN}
    assert refused == [403, "IDENTITY_ADMIN_FORBIDDEN"]
    assert operator == {
        "imports": ["Cancel", "Reset leases", "Start run"],
        "quarantine": ["Replay", "Replay all", "Replay selected", "(item checkboxes)"],
        "fanout": ["Discard", "Replay"],
        "roles": ["Edit"],
    }

    page.click('.tabs a[data-section="fanout"]')
    page.locator(f'#tasks-table tr[data-task-id="{task_id}"]').get_by_role("button", name="Replay").click()
    expect(page.locator("#fanout-outcome")).to_contain_text(f"task {task_id} is Pending again")
    [replayed] = [line for line in audit_lines(console) if line["action"] == "fanout-replay"]
    assert (replayed["who"], replayed["client"]) == ("http:olga", "127.0.0.1")


# ---------------------------------------------------------------- nothing from elsewhere


def test_no_page_asks_another_host_for_anything(console: Console, page: Page, database_url: str) -> None:
    """Every request the console makes while an operator goes through every section, and those of the pages
    `serve` might serve as documentation (`/docs` and `/redoc` are gone: they loaded scripts from a CDN)."""
    failed_fanout_task(console.container, database_url)
    requested: list[Request] = []
    page.context.on("request", lambda request: requested.append(request))  # noqa: PLW0108 - not a builtin
    sign_in(page, console, token=OPERATOR_TOKEN)
    for section in ("imports", "quarantine", "fanout", "roles", "health"):
        page.click(f'.tabs a[data-section="{section}"]')
        expect(page.locator(f"#{section}")).to_be_visible()
    expect(page.locator('#h-cards [data-stat="fanout-failed"] .stat-value')).to_have_text("1")
    answered = {}
    for path in ("/openapi.json", "/docs", "/redoc"):
        answer = page.goto(f"{console.base}{path}", wait_until="networkidle")
        answered[path] = answer.status if answer else None

    places = sorted({f"{urlsplit(r.url).scheme}://{urlsplit(r.url).netloc}" for r in requested})
    print(f"{len(requested)} requests; hosts contacted: {places}")
    assert places == [console.base]
    paths = {urlsplit(r.url).path for r in requested}
    assert {
        "/ui/",
        "/ui/console.js",
        "/ui/console.css",
        "/admin/v1/whoami",
        "/admin/v1/health/summary",
    } <= paths
    assert answered == {"/openapi.json": 200, "/docs": 404, "/redoc": 404}


# ---------------------------------------------------------------- imports


def _step_until_pages_done(
    runner: TalentImportJob, run_id: uuid.UUID, store: PostgresImportStore, pages: int
) -> None:
    """What a worker does, one page at a time (the first step takes the run lock and lists the source), until
    `pages` are Done and some still wait."""

    def done() -> bool:
        run = store.load_run(run_id)
        assert run is not None
        runner.step(run)
        progress = store.progress(run_id)
        return (
            progress.count(status=PageStatus.DONE) >= pages and progress.count(status=PageStatus.PENDING) > 0
        )

    wait_until(done, f"{pages} pages of run {run_id} are Done")


def test_imports_start_a_run_follow_its_progress_reset_leases_and_cancel_it(
    console: Console, page: Page
) -> None:
    finished, _ = poisoned_bootstrap(console.world)
    sign_in(page, console)
    done_row = page.locator(f'#runs-table tr[data-run-id="{finished.run_id}"]')
    expect(done_row).to_contain_text("Completed")
    expect(done_row.locator("td").nth(7)).to_have_text("4")  # quarantined

    page.select_option("#start-form select[name=mode]", "ApiPull")
    page.fill("#start-form input[name=pageSize]", "2")
    page.click("#start-form button[type=submit]")
    expect(page.locator("#imports-outcome")).to_contain_text("202 Accepted")
    run_id = uuid.UUID(page.locator("#imports-outcome code.id").inner_text())
    expect(page.locator(f'#runs-table tr[data-run-id="{run_id}"]')).to_contain_text("Running")
    page.click("#start-form button[type=submit]")
    expect(page.locator("#imports-outcome")).to_contain_text("409 IDENTITY_IMPORT_ALREADY_RUNNING")

    # A worker takes the run (its lock) and applies a few pages; the page follows it by polling.
    runner = job(console.container)
    try:
        _step_until_pages_done(runner, run_id, console.container.stores.import_store, pages=3)
        detail = page.locator("#run-detail")
        expect(detail).to_have_attribute("data-run-id", str(run_id))
        expect(detail.locator("#run-percent")).not_to_have_text(re.compile(r"^0%"))
        expect(detail).to_contain_text("pin-identity talent-import")  # the lock holder
        expect(detail).to_contain_text("ETA")
        assert int(detail.locator("#run-progress").get_attribute("value") or 0) >= 3
        shoot(page, "imports")

        # A page whose worker died mid-way: reset leases makes it claimable at once.
        now = SYSTEM_CLOCK.now()
        assert console.container.stores.import_store.claim(
            uuid.uuid4(), now, now + timedelta(hours=1), run_id
        )
        detail.get_by_role("button", name="Reset leases").click()
        expect(page.locator("#imports-outcome")).to_contain_text("200 OK 1 InProgress pages claimable again")

        cancel = detail.get_by_role("button", name="Cancel")
        cancel.click()
        expect(detail.get_by_role("button", name="Click again to confirm")).to_be_visible()
        detail.get_by_role("button", name="Click again to confirm").click()
        expect(page.locator("#imports-outcome")).to_contain_text(f"run {run_id} is Cancelled")
        expect(page.locator(f'#runs-table tr[data-run-id="{run_id}"]')).to_contain_text("Cancelled")
    finally:
        runner.lock.release()
        runner.close()
    stored = console.container.stores.import_store.load_run(run_id)
    assert stored is not None and stored.status is RunStatus.CANCELLED
    assert {"talent-import-start", "talent-import-reset-leases", "talent-import-cancel"} <= set(
        audit_actions(console)
    )
    assert {(line["who"], line["client"]) for line in audit_lines(console)} == {("http:admin", "127.0.0.1")}


# ---------------------------------------------------------------- quarantine


def _consumer_quarantine(container: Container) -> dict[str, str]:
    """The continuous consumer's quarantine, by the real apply path: a user before its tenant (fixable: the
    tenant then arrives) and a user with an unparseable phone (stays poison)."""
    company = talent.tenant()
    early = talent.user(company["tenantId"])
    broken = talent.user(company["tenantId"], phone="not a phone")
    talent.users(container, early, broken)
    talent.tenants(container, company)
    return {"early": early["userId"], "broken": broken["userId"]}


def test_a_poll_that_answers_while_the_operator_presses_a_button_does_not_eat_the_click(
    console: Console, page: Page
) -> None:
    """The followed run is polled every 2 s and its card redrawn. An operator pressing Cancel as a poll
    answers (a human's press lasts a tenth of a second) must still get the click: the redraw waits for the
    release."""
    console.world.publish(generate_dataset(6, 0))
    run_id = _running_import(console)
    sign_in(page, console)
    detail = page.locator(f'#run-detail[data-run-id="{run_id}"]')
    cancel = detail.get_by_role("button", name="Cancel")
    expect(cancel).to_be_visible()
    box = cancel.bounding_box()
    assert box is not None
    pressed = cancel.element_handle()
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)

    with page.expect_response(lambda answer: answer.url.endswith(f"/talent-import/runs/{run_id}")):
        page.mouse.down()  # held while the next poll of the run answers
    # Either the answer was drawn under the pressed button (it is gone), or its drawing waits for the release.
    page.wait_for_function(
        "button => !button.isConnected || Number(document.documentElement.dataset.drawsWaiting || 0) > 0",
        arg=pressed,
    )
    page.mouse.up()

    expect(detail.get_by_role("button", name="Click again to confirm")).to_be_visible()


def _running_import(console: Console) -> uuid.UUID:
    """A run started over the API and left Running: no worker takes it, so the page follows it by polling."""
    answer = httpx.post(
        f"{console.base}/admin/v1/talent-import/runs",
        json={"mode": "ApiPull", "pageSize": 2},
        headers=bearer(TOKEN),
        timeout=10,
    )
    assert answer.status_code == 202, answer.text
    return uuid.UUID(answer.json()["runId"])


def test_quarantine_filter_by_code_and_replay_one_several_or_all(console: Console, page: Page) -> None:
    run, _ = poisoned_bootstrap(console.world)
    consumer = _consumer_quarantine(console.container)
    sign_in(page, console, "quarantine")
    rows = page.locator("#items-table tbody tr")
    expect(rows).to_have_count(2)

    page.select_option("#q-code", "IDENTITY_SYNC_COMPANY_NOT_FOUND")
    expect(rows).to_have_count(1)
    expect(rows.first).to_contain_text(consumer["early"])
    page.click("#q-replay-all")  # "Replay the 1 shown", confirmed by a second click
    page.click("#q-replay-all")
    expect(page.locator("#quarantine-outcome")).to_contain_text("applied 1, skipped 0, failed again 0")
    expect(rows).to_have_count(1)
    expect(rows.first).to_contain_text(consumer["broken"])
    expect(rows.first).to_contain_text("IDENTITY_SYNC_INVALID_PAYLOAD")
    rows.first.get_by_role("button", name="Replay").click()
    expect(page.locator("#quarantine-outcome")).to_contain_text("applied 0, skipped 0, failed again 1")

    page.select_option("#q-owner", str(run.run_id))
    expect(rows).to_have_count(4)
    codes = sorted(rows.locator("td:nth-child(2)").all_inner_texts())
    assert codes == sorted(
        [
            "IDENTITY_SYNC_UNKNOWN_COMPANY_TYPE",
            "IDENTITY_SYNC_PHONE_CONFLICT",
            "IDENTITY_SYNC_INVALID_PAYLOAD",
            "IDENTITY_SYNC_COMPANY_NOT_FOUND",
        ]
    )
    assert all(reason.strip() not in ("", "—") for reason in rows.locator("td.reason").all_inner_texts())
    rows.nth(0).locator("input.pick").check()
    rows.nth(1).locator("input.pick").check()
    expect(page.locator("#q-replay-selected")).to_have_text("Replay selected (2)")
    page.click("#q-replay-selected")
    expect(page.locator("#quarantine-outcome")).to_contain_text("failed again 2")
    expect(rows).to_have_count(4)  # still poison: they stay, with their reasons
    shoot(page, "quarantine")
    assert audit_actions(console).count("talent-import-replay-failed") == 1


# ---------------------------------------------------------------- fan-out


def test_fanout_lists_tasks_by_status_and_replays_a_failed_one(
    console: Console, page: Page, database_url: str
) -> None:
    task_id = failed_fanout_task(console.container, database_url)
    sign_in(page, console, "fanout")
    row = page.locator(f'#tasks-table tr[data-task-id="{task_id}"]')
    expect(row).to_contain_text("Failed")
    expect(row).to_contain_text("the broker refused the batch")
    expect(row.locator("td").nth(4)).to_have_text("5")  # attempts
    shoot(page, "fanout")

    row.get_by_role("button", name="Replay").click()
    expect(page.locator("#fanout-outcome")).to_contain_text(f"task {task_id} is Pending again")
    expect(row).to_have_attribute("data-status", "Pending")
    expect(row.get_by_role("button", name="Replay")).to_have_count(0)
    page.select_option("#f-status", "Failed")
    expect(page.locator("#tasks-table tbody tr")).to_have_count(0)
    page.select_option("#f-status", "Pending")
    expect(row).to_be_visible()
    assert "fanout-replay" in audit_actions(console)


def test_fanout_discards_a_failed_task_on_a_second_click(
    console: Console, page: Page, database_url: str
) -> None:
    task_id = failed_fanout_task(console.container, database_url)
    sign_in(page, console, "fanout")
    row = page.locator(f'#tasks-table tr[data-task-id="{task_id}"]')
    row.get_by_role("button", name="Discard").click()
    confirm = row.get_by_role("button", name="Click again to confirm")
    expect(confirm).to_be_visible()
    assert "fanout-discard" not in audit_actions(console)

    confirm.click()
    expect(page.locator("#fanout-outcome")).to_contain_text(f"task {task_id} discarded")
    expect(row).to_have_count(0)
    [discarded] = [line for line in audit_lines(console) if line["action"] == "fanout-discard"]
    assert (discarded["who"], discarded["task_id"]) == ("http:admin", task_id)


# ---------------------------------------------------------------- roles


def _role_with_holders(container: Container, code: str, holders: int, name: str | None = None) -> str:
    company_id = seed.company(container.stores.identity_transactions, name=f"Company of {code}")
    role_id = identity_changes.create_role(
        container.stores.identity_transactions,
        code=code,
        name=name or code,
        company_id=company_id,
        permissions=["deals.read"],
    )
    for _ in range(holders):
        seed.grant(
            container.stores.identity_transactions,
            seed.user(container.stores.identity_transactions, company_id),
            role_id,
            company_id,
        )
    return str(role_id)


def _save_permissions(page: Page, role_id: str, permissions: str) -> None:
    page.locator(f'#roles-table tr[data-role-id="{role_id}"]').get_by_role("button", name="Edit").click()
    page.fill("#r-permissions", permissions)
    page.click("#role-editor button[type=submit]")


def test_roles_show_size_and_permissions_and_a_change_is_inline_or_queued(
    console: Console, page: Page
) -> None:
    small = _role_with_holders(console.container, "site-manager", holders=1)
    large = _role_with_holders(console.container, "sales-manager", holders=2, name=HOSTILE_NAME)
    sign_in(page, console, "roles")
    small_row = page.locator(f'#roles-table tr[data-role-id="{small}"]')
    large_row = page.locator(f'#roles-table tr[data-role-id="{large}"]')
    expect(page.locator('#roles-table tr[data-code="developer-manager"]')).to_contain_text("system role")
    expect(small_row.locator("td").nth(5)).to_have_text("1")
    expect(large_row.locator("td").nth(5)).to_have_text("2")
    expect(large_row.locator("td").nth(1)).to_have_text(HOSTILE_NAME)  # as text, never as markup
    assert page.locator("#roles-table img, #roles-table b").count() == 0

    _save_permissions(page, small, "deals.read\ndeals.approve\n")
    expect(page.locator("#roles-outcome")).to_contain_text("version 2: inline, 1 users notified")
    expect(small_row.locator(".chip")).to_have_text(["deals.approve", "deals.read"])

    _save_permissions(page, large, "deals.read, chessboard.view")
    expect(page.locator("#roles-outcome")).to_contain_text("version 2: queued, fan-out task")
    task_id = page.locator("#roles-outcome code.id").inner_text()
    expect(page.locator("#role-editor")).to_contain_text("version 2")
    shoot(page, "roles")

    page.locator("#roles-outcome").get_by_role("button", name="See it in Fan-out").click()
    expect(page.locator(f'#tasks-table tr[data-task-id="{task_id}"]')).to_contain_text("Pending")
    assert audit_actions(console).count("set-role-permissions") == 2


# ---------------------------------------------------------------- access


def _look_up(page: Page, user: uuid.UUID | str) -> None:
    page.fill("#a-user", str(user))
    page.click("#access-find button[type=submit]")


def test_access_looks_a_user_up_with_the_answer_of_access_show(
    console: Console, page: Page, database_url: str, subprocess_env: dict[str, str]
) -> None:
    container = console.container
    company = seed.company(container.stores.identity_transactions)
    role = seed.role(container.stores.identity_transactions, company, code="site-manager")
    matching, drifted = (seed.user(container.stores.identity_transactions, company) for _ in range(2))
    granted = {
        user: seed.grant(container.stores.identity_transactions, user, role, company)
        for user in (matching, drifted)
    }
    publish_outbox(container)
    with psycopg.connect(database_url) as conn:  # behind the service's back: consumers still grant it
        conn.execute(
            "UPDATE identity.role_assignments SET status = 'Revoked' WHERE id = %s",
            (granted[drifted],),
        )

    sign_in(page, console, "access")
    _look_up(page, matching)
    expect(page.locator("#access-detail")).to_have_attribute("data-verdict", "matching")
    expect(page.locator("#access-table tbody tr")).to_have_count(1)
    row = page.locator(f'#access-table tr[data-assignment-id="{granted[matching]}"]')
    expect(row).to_have_attribute("data-standing", "same in both")
    expect(page.locator("#access-detail")).to_contain_text("RoleAssigned")
    shoot(page, "access-matching")

    _look_up(page, drifted)
    expect(page.locator("#access-detail")).to_have_attribute("data-verdict", "drifted")
    row = page.locator(f'#access-table tr[data-assignment-id="{granted[drifted]}"]')
    expect(row).to_have_attribute("data-standing", "only on the topic")
    shown = run_cli_json(subprocess_env, "access", "show", str(drifted))
    expect(page.locator("#access-detail")).to_contain_text(f"offset {shown['lastEvent']['offset']:,}")
    assert shown["verdict"] == "drifted"
    shoot(page, "access-drifted")

    unknown = uuid.uuid4()
    _look_up(page, unknown)
    expect(page.locator("#access-outcome")).to_contain_text("404 IDENTITY_NOT_FOUND")
    expect(page.locator("#access-detail")).to_be_hidden()


def run_cli_json(env: dict[str, str], *args: str) -> dict[str, Any]:
    result = run_cli(env, *args, "--json")
    assert result.stdout, result.stderr
    document: dict[str, Any] = json.loads(result.stdout)
    return document


# ---------------------------------------------------------------- health


def _metric(console: Console, name: str) -> float:
    text = httpx.get(f"{console.base}/metrics").text
    found = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
    assert found, name
    return float(found.group(1))


def test_health_shows_the_gauges_of_metrics_the_consumer_lag_and_dead_letters(
    console: Console, page: Page, database_url: str
) -> None:
    _, dataset = poisoned_bootstrap(console.world)
    failed_fanout_task(console.container, database_url)
    # The server reads the database gauges at most every few seconds: wait out a reading from before the
    # bootstrap. Its events stay in the outbox, no relay running.
    wait_until(lambda: _metric(console, "identity_outbox_backlog") > 0, "the outbox backlog is read")
    backlog = int(_metric(console, "identity_outbox_backlog"))
    sign_in(page, console, "health")
    stat = lambda key: page.locator(f'#h-cards [data-stat="{key}"] .stat-value')  # noqa: E731
    expect(stat("outbox-backlog")).to_have_text(f"{backlog:,}")
    expect(stat("fanout-failed")).to_have_text("1")
    expect(page.locator('#h-cards [data-stat="fanout-failed"]')).to_have_class(re.compile("alarm"))
    expect(stat("fanout-backlog")).to_have_text(
        str(int(_metric(console, "identity_access_fanout_queue_backlog")))
    )
    expect(stat("dead-letters")).to_have_text("0")
    expect(stat("import-running")).to_have_text("no")
    # The caption says what the value says, not the opposite.
    note = lambda key: page.locator(f'#h-cards [data-stat="{key}"] .stat-note')  # noqa: E731
    expect(note("import-running")).to_have_text("no talent-import run is Running")
    expect(note("fanout-backlog")).to_have_text(
        "Pending tasks, expired leases and tasks waiting out a back-off"
    )
    # Nobody consumed Talent's topics in this group yet: every record produced is lag.
    expect(stat("consumer-lag")).to_have_text(f"{len(dataset.tenants) + len(dataset.users):,}")
    expect(page.locator("#lag-table tbody tr")).to_have_count(6)  # two topics of three partitions
    shoot(page, "health")


# ---------------------------------------------------------------- demo --keep-running


def _alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists() and "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()


@pytest.mark.timeout(240)
def test_demo_keep_running_leaves_the_console_up_and_says_how_to_read_its_token(
    subprocess_env: dict[str, str], own_broker: str, page: Page, tmp_path: Path
) -> None:
    env = {**subprocess_env, "PIN_IDENTITY_KAFKA_BOOTSTRAP_SERVERS": own_broker}
    pid_file = Path(env["PIN_IDENTITY_DATA_DIR"]) / "console.pid"
    demo = run_cli(
        env, "demo", "--companies", "3", "--users", "250", "--keep-running", cwd=tmp_path, timeout=200
    )
    pid = int(pid_file.read_text()) if pid_file.exists() else None
    try:
        assert demo.returncode == 0, demo.stderr[-2000:]
        url = re.search(r"^operator console\s+(http://\S+/ui/)$", demo.stdout, re.MULTILINE)
        token_file = re.search(r"^token\s+cat (\S+)$", demo.stdout, re.MULTILINE)
        assert url and token_file, demo.stdout[-1500:]
        secret = Path(token_file.group(1))
        assert secret.stat().st_mode & 0o777 == 0o600
        token = secret.read_text().strip()
        assert token not in demo.stdout + demo.stderr

        page.goto(url.group(1) + "#roles")
        page.fill("#token-input", token)
        page.click("#token-form button[type=submit]")
        manager_role = page.locator('#roles-table tr[data-code="developer-manager"]')
        expect(manager_role.locator("td").nth(5)).to_have_text("250")  # the demo's bootstrapped managers

        stopped = run_cli(env, "embedded", "stop", cwd=tmp_path)
        assert "console (serve) stopped" in stopped.stdout
        assert pid is not None
        wait_until(lambda: not _alive(pid), "the console's serve has stopped")
    finally:
        if pid is not None and _alive(pid):
            os.kill(pid, signal.SIGKILL)
