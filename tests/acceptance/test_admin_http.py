"""The platform-admin HTTP API (`pin-identity serve`, CONTRACTS section 6) on the real database and broker."""

from __future__ import annotations

import hashlib
import json
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import fastapi.routing
import httpx
import psycopg
import pytest
import schemathesis
import yaml
from fastapi import FastAPI
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from openapi_spec_validator import validate
from schemathesis.checks import not_a_server_error
from structlog.testing import capture_logs

from pin_identity.adapters.kafka.embedded_kafka import free_port
from pin_identity.adapters.system_clock import SYSTEM_CLOCK
from pin_identity.composition import Container
from pin_identity.config import ConfigurationError, Settings
from pin_identity.entrypoints.admin_http import create_app
from pin_identity.operations import identity_changes
from pin_identity.operations.context import Context
from pin_identity.simulation.simulated_talent import SimulatedTalentApi, generate_dataset
from tests.support import seed, talent
from tests.support.cli import run_cli
from tests.support.health import wait_for_healthz
from tests.support.operators import bearer, write_tokens_file
from tests.support.relay import publish_outbox
from tests.support.talent import TalentTopics
from tests.support.talent_import import job
from tests.support.waiting import wait_until

TOKEN = "secret-token"  # PIN_IDENTITY_ADMIN_TOKEN: the operator `admin`
AUTH = bearer(TOKEN)
OPERATOR_TOKEN, VIEWER_TOKEN = "olga-token", "victor-token"
OPERATORS = {"olga": ("operator", OPERATOR_TOKEN), "victor": ("viewer", VIEWER_TOKEN)}
UNKNOWN = "00000000-0000-4000-8000-00000000beef"
RUNS = "/admin/v1/talent-import/runs"
TASKS = "/admin/v1/access-fanout/tasks"
SYNC_ITEMS = "/admin/v1/talent-sync/failed-items"
ACCESS = "/admin/v1/access/users"
MIB = 1024 * 1024  # the largest body an admin route takes (CONTRACTS section 6)
GIB = 1024 * MIB


# ---------------------------------------------------------------- fixtures and helpers


def _admin_container(settings: Settings, **overrides: Any) -> Container:
    """Three operators: `admin` (PIN_IDENTITY_ADMIN_TOKEN), and the tokens file's operator and viewer."""
    tokens_file = write_tokens_file(settings.data_dir / "operators", OPERATORS)
    update = {"admin_token": TOKEN, "admin_tokens_file": tokens_file, **overrides}
    return Container(settings.model_copy(update=update))


@pytest.fixture
def admin_container(settings: Settings, talent_api: SimulatedTalentApi) -> Iterator[Container]:
    """Talent served by the simulator; every role with a user goes through the fan-out queue."""
    built = _admin_container(
        settings,
        talent_api_url=talent_api.url,
        talent_api_token="talent-token",
        inline_fanout_threshold=0,
    )
    yield built
    built.close()


@pytest.fixture
def client(admin_container: Container) -> Iterator[TestClient]:
    with TestClient(create_app(admin_container)) as opened:
        yield opened


def assert_problem(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    body: dict[str, Any] = response.json()
    assert {"type", "title", "status", "detail", "code"} <= body.keys()
    assert body["status"] == status and body["code"] == code
    assert body["type"] == f"urn:pin-identity:problem:{code}"
    return body


def start(client: TestClient, **body: Any) -> str:
    response = client.post(RUNS, json={"mode": "ApiPull", **body}, headers=AUTH)
    assert response.status_code == 202, response.text
    run_id: str = response.json()["runId"]
    return run_id


def queued_task(container: Container) -> tuple[str, str]:
    """A role of one user, changed through the API's own operation: a Pending fan-out task."""
    _, role_id = seed.held_role(container.stores.identity_transactions, 1)
    change = seed.change_permissions(
        container.stores.identity_transactions,
        role_id,
        ["deals.read", "deals.write"],
        container.use_cases.fanout_policy,
    )
    assert change.task_id is not None
    return str(role_id), str(change.task_id)


def fail_task(database_url: str, task_id: str) -> None:
    """What the fan-out job does after MaxAttempts: the task is poison."""
    with psycopg.connect(database_url) as conn:
        conn.execute(
            "UPDATE identity.access_fanout_tasks SET status = 'Failed', attempt_count = 5 WHERE id = %s",
            (task_id,),
        )


def audit_lines(logs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [line for line in logs if line["event"] == "admin-action"]


# ---------------------------------------------------------------- talent import runs


def test_a_run_started_over_http_is_orchestrated_by_a_worker(
    client: TestClient, admin_container: Container, talent_api: SimulatedTalentApi
) -> None:
    talent_api.dataset = generate_dataset(3, 6, poison=True)
    with capture_logs() as logs:
        response = client.post(RUNS, json={"mode": "api-pull", "pageSize": 2}, headers=AUTH)
    assert response.status_code == 202, response.text
    run_id = response.json()["runId"]
    assert response.headers["location"] == f"{RUNS}/{run_id}"
    [audit] = audit_lines(logs)
    assert audit["action"] == "talent-import-start" and audit["run_id"] == run_id
    assert (audit["who"], audit["client"]) == ("http:admin", "testclient")  # TestClient's address
    assert TOKEN not in str(audit)

    running = client.get(f"{RUNS}/{run_id}", headers=AUTH).json()
    assert running["status"] == "Running" and running["mode"] == "ApiPull"
    assert running["lockHolder"] is None  # the API let go of the lock: a worker takes it

    job(admin_container).run(threading.Event(), once=True)

    report = client.get(f"{RUNS}/{run_id}", headers=AUTH).json()
    assert report["status"] == "Completed", report
    assert report["companies"]["planned"] == 4 and report["users"]["planned"] == 9
    assert report["pages"]["Tenants"]["Done"] == 2 and report["pages"]["Users"]["Done"] == 5
    items = client.get(f"{RUNS}/{run_id}/failed-items", headers=AUTH).json()
    assert len(items) == report["companies"]["failed"] + report["users"]["failed"] > 0
    assert all(item.keys() >= {"itemId", "stage", "externalId", "errorCode"} for item in items)
    assert not any("payload" in item for item in items)  # PII stays in the database


def test_a_second_start_while_a_run_is_running_is_409(client: TestClient) -> None:
    start(client, dryRun=True)
    response = client.post(RUNS, json={"mode": "TopicReplay"}, headers=AUTH)
    assert_problem(response, 409, "IDENTITY_IMPORT_ALREADY_RUNNING")


def test_a_start_while_another_process_holds_the_run_lock_is_409(
    client: TestClient, admin_container: Container
) -> None:
    lock = admin_container.stores.run_lock()
    assert lock.try_acquire()
    try:
        response = client.post(RUNS, json={"mode": "ApiPull"}, headers=AUTH)
    finally:
        lock.release()
    body = assert_problem(response, 409, "IDENTITY_IMPORT_ALREADY_RUNNING")
    assert "holds the lock" in body["detail"]


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"mode": "sideways"},
        {"mode": "ApiPull", "pageSize": 0},
        {"mode": "ApiPull", "pageSize": 2001},
        {"mode": "ApiPull", "talentTenantIdFilter": "not-a-uuid"},
        {"mode": "ApiPull", "dryRun": "perhaps"},
    ],
)
def test_a_start_with_bad_input_is_422(client: TestClient, body: dict[str, Any]) -> None:
    problem = assert_problem(client.post(RUNS, json=body, headers=AUTH), 422, "IDENTITY_INVALID_REQUEST")
    assert problem["errors"] and problem["errors"][0]["location"].startswith("body")


@pytest.mark.parametrize(
    "body",
    [
        {"mode": "ApiPull", "force": 0},
        {"mode": "ApiPull", "force": "false"},
        {"mode": "ApiPull", "dryRun": 1},
        {"mode": "ApiPull", "dryRun": "true"},
    ],
    ids=["force-0", "force-string", "dryRun-1", "dryRun-string"],
)
def test_a_flag_that_is_not_a_json_boolean_is_422(client: TestClient, body: dict[str, Any]) -> None:
    problem = assert_problem(client.post(RUNS, json=body, headers=AUTH), 422, "IDENTITY_INVALID_REQUEST")
    flag = next(name for name in ("force", "dryRun") if name in body)
    assert [issue["location"] for issue in problem["errors"]] == [f"body.{flag}"]


@pytest.mark.parametrize("content", [b"{not json", b"\xff\xfe", b""])
def test_a_start_with_an_unreadable_body_is_422(client: TestClient, content: bytes) -> None:
    headers = {**AUTH, "Content-Type": "application/json"}
    response = client.post(RUNS, content=content, headers=headers)
    assert_problem(response, 422, "IDENTITY_INVALID_REQUEST")


def test_a_start_with_an_unavailable_source_is_503(
    client: TestClient, talent_api: SimulatedTalentApi
) -> None:
    talent_api.healthy = False
    response = client.post(RUNS, json={"mode": "ApiPull"}, headers=AUTH)
    assert_problem(response, 503, "IDENTITY_IMPORT_SOURCE_UNAVAILABLE")


def test_a_start_without_a_configured_talent_api_is_503(settings: Settings) -> None:
    container = _admin_container(settings, talent_api_url=None)
    try:
        with TestClient(create_app(container)) as unconfigured:
            response = unconfigured.post(RUNS, json={"mode": "api-pull"}, headers=AUTH)
    finally:
        container.close()
    body = assert_problem(response, 503, "IDENTITY_IMPORT_SOURCE_UNAVAILABLE")
    assert "PIN_IDENTITY_TALENT_API_URL" in body["detail"]


def test_cancel_a_running_run_then_again(client: TestClient) -> None:
    run_id = start(client)
    with capture_logs() as logs:
        cancelled = client.post(f"{RUNS}/{run_id}/cancel", headers=AUTH)
    assert cancelled.status_code == 200
    assert cancelled.json() == {"runId": run_id, "status": "Cancelled"}
    assert audit_lines(logs)[0]["action"] == "talent-import-cancel"
    assert client.get(f"{RUNS}/{run_id}", headers=AUTH).json()["status"] == "Cancelled"
    again = client.post(f"{RUNS}/{run_id}/cancel", headers=AUTH)
    assert_problem(again, 409, "IDENTITY_IMPORT_NOT_RUNNING")


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", f"{RUNS}/{UNKNOWN}"),
        ("POST", f"{RUNS}/{UNKNOWN}/cancel"),
        ("GET", f"{RUNS}/{UNKNOWN}/failed-items"),
        ("POST", f"{TASKS}/{UNKNOWN}/replay"),
        ("POST", f"{TASKS}/{UNKNOWN}/discard"),
    ],
)
def test_an_unknown_id_is_404(client: TestClient, method: str, path: str) -> None:
    assert_problem(client.request(method, path, headers=AUTH), 404, "IDENTITY_NOT_FOUND")


def test_a_malformed_id_is_422(client: TestClient) -> None:
    body = assert_problem(client.get(f"{RUNS}/nope", headers=AUTH), 422, "IDENTITY_INVALID_REQUEST")
    assert body["errors"][0]["location"] == "path.runId"


# ---------------------------------------------------------------- access fan-out and roles


def test_fanout_tasks_are_listed_and_a_failed_one_is_replayed(
    client: TestClient, admin_container: Container, database_url: str
) -> None:
    role_id, task_id = queued_task(admin_container)
    [listed] = client.get(TASKS, headers=AUTH).json()
    assert listed["taskId"] == task_id and listed["roleId"] == role_id
    assert listed["status"] == "Pending" and listed["roleVersion"] == 2
    assert client.get(TASKS, params={"status": "Failed"}, headers=AUTH).json() == []
    assert_problem(client.post(f"{TASKS}/{task_id}/replay", headers=AUTH), 409, "IDENTITY_CONFLICT")

    fail_task(database_url, task_id)
    assert [t["taskId"] for t in client.get(TASKS, params={"status": "Failed"}, headers=AUTH).json()] == [
        task_id
    ]
    with capture_logs() as logs:
        replayed = client.post(f"{TASKS}/{task_id}/replay", headers=bearer(OPERATOR_TOKEN))
    assert replayed.status_code == 200
    assert replayed.json() == {"taskId": task_id, "status": "Pending"}
    [audit] = audit_lines(logs)
    assert audit["action"] == "fanout-replay" and audit["task_id"] == task_id
    assert (audit["who"], audit["client"]) == ("http:olga", "testclient")
    [again] = client.get(TASKS, params={"status": "Pending"}, headers=AUTH).json()
    assert again["attemptCount"] == 0


def test_a_failed_fanout_task_is_discarded_by_an_operator_and_leaves_the_queue(
    client: TestClient, admin_container: Container, database_url: str
) -> None:
    role_id, task_id = queued_task(admin_container)
    assert_problem(client.post(f"{TASKS}/{task_id}/discard", headers=AUTH), 409, "IDENTITY_CONFLICT")
    fail_task(database_url, task_id)
    refused = client.post(f"{TASKS}/{task_id}/discard", headers=bearer(VIEWER_TOKEN))
    assert_problem(refused, 403, "IDENTITY_ADMIN_FORBIDDEN")

    with capture_logs() as logs:
        discarded = client.post(f"{TASKS}/{task_id}/discard", headers=bearer(OPERATOR_TOKEN))
    assert discarded.status_code == 200, discarded.text
    answer = discarded.json()
    assert {k: answer[k] for k in ("taskId", "roleId", "roleVersion", "processedCount", "toldBy")} == {
        "taskId": task_id,
        "roleId": role_id,
        "roleVersion": 2,
        "processedCount": 0,
        "toldBy": None,
    }
    # Nothing newer told the role's users: the answer says so, and how to re-announce.
    assert answer["usersPastCursor"] == "never-told"
    assert f"roles set-permissions {role_id}" in answer["detail"]
    [audit] = audit_lines(logs)
    assert (audit["action"], audit["task_id"], audit["role_id"]) == ("fanout-discard", task_id, role_id)
    assert (audit["who"], audit["client"]) == ("http:olga", "testclient")
    assert client.get(TASKS, headers=AUTH).json() == []
    assert_problem(client.post(f"{TASKS}/{task_id}/discard", headers=AUTH), 404, "IDENTITY_NOT_FOUND")


@pytest.mark.parametrize("query", [{"status": "Bogus"}, {"limit": "0"}, {"limit": "many"}])
def test_a_bad_task_filter_is_422(client: TestClient, query: dict[str, str]) -> None:
    assert_problem(client.get(TASKS, params=query, headers=AUTH), 422, "IDENTITY_INVALID_REQUEST")


def test_set_role_permissions_queues_the_fanout_of_a_large_role(
    client: TestClient, admin_container: Container
) -> None:
    company_id = seed.company(admin_container.stores.identity_transactions)
    role_id = seed.role(admin_container.stores.identity_transactions, company_id)
    seed.grant(
        admin_container.stores.identity_transactions,
        seed.user(admin_container.stores.identity_transactions, company_id),
        role_id,
        company_id,
    )
    with capture_logs() as logs:
        response = client.put(
            f"/admin/v1/roles/{role_id}/permissions",
            json={"permissions": ["deals.read", "deals.approve"]},
            headers=AUTH,
        )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["roleId"] == str(role_id) and body["roleVersion"] == 2
    assert body["path"] == "queued" and body["usersNotifiedInline"] == 0
    assert [t["taskId"] for t in client.get(TASKS, headers=AUTH).json()] == [body["taskId"]]
    [audit] = audit_lines(logs)
    assert audit["action"] == "set-role-permissions" and audit["role_id"] == str(role_id)


def test_set_role_permissions_of_a_role_without_users_notifies_inline(
    client: TestClient, admin_container: Container
) -> None:
    role_id = seed.role(
        admin_container.stores.identity_transactions,
        seed.company(admin_container.stores.identity_transactions),
    )
    response = client.put(f"/admin/v1/roles/{role_id}/permissions", json={"permissions": []}, headers=AUTH)
    assert response.json() == {
        "roleId": str(role_id),
        "roleVersion": 2,
        "path": "inline",
        "usersNotifiedInline": 0,
        "taskId": None,
    }


def test_set_role_permissions_errors(client: TestClient, admin_container: Container) -> None:
    path = "/admin/v1/roles/{}/permissions"
    unknown = client.put(path.format(UNKNOWN), json={"permissions": ["a"]}, headers=AUTH)
    assert_problem(unknown, 404, "IDENTITY_NOT_FOUND")
    role_id = seed.role(
        admin_container.stores.identity_transactions,
        seed.company(admin_container.stores.identity_transactions),
    )
    blank = client.put(path.format(role_id), json={"permissions": [" "]}, headers=AUTH)
    assert_problem(blank, 422, "IDENTITY_INVALID_INPUT")
    for body in ({}, {"permissions": "deals.read"}, {"permissions": ["a\x00b"]}):
        bad = client.put(path.format(role_id), json=body, headers=AUTH)
        assert_problem(bad, 422, "IDENTITY_INVALID_REQUEST")
    identity_changes.archive_role(
        admin_container.stores.identity_transactions, Context.fresh(SYSTEM_CLOCK), role_id
    )
    archived = client.put(path.format(role_id), json={"permissions": ["a"]}, headers=AUTH)
    assert_problem(archived, 409, "IDENTITY_CONFLICT")


# ---------------------------------------------------------------- one user's access


def test_a_users_access_is_the_document_access_show_prints(
    client: TestClient, admin_container: Container, subprocess_env: dict[str, str]
) -> None:
    company = seed.company(admin_container.stores.identity_transactions)
    role = seed.role(admin_container.stores.identity_transactions, company)
    user = seed.user(admin_container.stores.identity_transactions, company)
    grant = seed.grant(admin_container.stores.identity_transactions, user, role, company)
    publish_outbox(admin_container)
    answer = client.get(f"{ACCESS}/{user}", headers=AUTH)
    assert answer.status_code == 200, answer.text
    document = answer.json()
    assert (document["verdict"], document["outbox"], document["deadLetters"]) == ("matching", [], [])
    assert [a["assignmentId"] for a in document["activeAssignments"]] == [str(grant)]
    assert document["lastEvent"]["activeAssignments"] == document["activeAssignments"]
    printed = run_cli(subprocess_env, "access", "show", str(user), "--json")
    assert json.loads(printed.stdout) == document

    identity_changes.revoke_role_assignment(
        admin_container.stores.identity_transactions, Context.fresh(SYSTEM_CLOCK), grant
    )
    pending = client.get(f"{ACCESS}/{user}", headers=AUTH).json()
    assert pending["verdict"] == "pending"  # 200 whatever the verdict: the answer is the document
    assert pending["difference"] == {"onlyInDatabase": [], "onlyOnTopic": [str(grant)], "changed": []}


def test_a_users_access_errors(client: TestClient, admin_container: Container, settings: Settings) -> None:
    assert_problem(client.get(f"{ACCESS}/{UNKNOWN}", headers=AUTH), 404, "IDENTITY_NOT_FOUND")
    malformed = assert_problem(client.get(f"{ACCESS}/nope", headers=AUTH), 422, "IDENTITY_INVALID_REQUEST")
    assert malformed["errors"][0]["location"] == "path.userId"
    user = seed.user(admin_container.stores.identity_transactions)
    no_broker = _admin_container(settings, kafka_bootstrap_servers="127.0.0.1:1")
    try:
        with TestClient(create_app(no_broker)) as unready:
            answer = unready.get(f"{ACCESS}/{user}", headers=AUTH)
    finally:
        no_broker.close()
    body = assert_problem(answer, 503, "IDENTITY_BROKER_UNAVAILABLE")
    assert body["detail"].startswith("PIN_IDENTITY_KAFKA_BOOTSTRAP_SERVERS: broker unreachable")


def test_the_consumers_quarantine_is_listed_with_reasons_and_replayed(
    client: TestClient, admin_container: Container
) -> None:
    tenant = talent.tenant()
    orphan, bad_phone = talent.user(tenant["tenantId"]), talent.user(tenant["tenantId"], phone="+7 000")
    talent.users(admin_container, orphan, bad_phone)  # as the consumer applies them: run_id null

    items = client.get(SYNC_ITEMS, headers=AUTH).json()
    reasons = {item["externalId"]: (item["errorCode"], item["reason"]) for item in items}
    assert reasons == {
        orphan["userId"]: ("IDENTITY_SYNC_COMPANY_NOT_FOUND", "the user's tenant is not in the replica"),
        bad_phone["userId"]: ("IDENTITY_SYNC_INVALID_PAYLOAD", "phone: not a valid phone number"),
    }
    unknown = client.post(f"{SYNC_ITEMS}/replay", json={"itemIds": [UNKNOWN]}, headers=AUTH)
    assert_problem(unknown, 404, "IDENTITY_NOT_FOUND")
    talent.tenants(admin_container, tenant)  # the operator fixed the cause of one of them
    with capture_logs() as logs:
        replayed = client.post(f"{SYNC_ITEMS}/replay", json={}, headers=AUTH)
    assert replayed.json() == {"applied": 1, "skipped": 0, "failed": 1, "notReplayable": 0}
    assert [line["action"] for line in audit_lines(logs)] == ["talent-sync-replay-failed"]
    assert [item["externalId"] for item in client.get(SYNC_ITEMS, headers=AUTH).json()] == [
        bad_phone["userId"]
    ]


# ---------------------------------------------------------------- authentication and roles

ROLE_TOKENS: dict[str, str | None] = {"none": None, "viewer": VIEWER_TOKEN, "operator": OPERATOR_TOKEN}
# Every admin route of the app (method, path template) -> what to call, and the status a viewer and an
# operator get (no token: 401 everywhere). Ids are unknown, so an admitted request ends at the route's own
# 404: proof that it got past admission. A route missing here fails the test that names every admin route.
ROLE_MATRIX: dict[tuple[str, str], tuple[str, dict[str, Any] | None, int, int]] = {
    ("GET", "/admin/v1/whoami"): ("/admin/v1/whoami", None, 200, 200),
    ("POST", RUNS): (RUNS, {"mode": "ApiPull", "dryRun": True}, 403, 202),
    ("GET", RUNS): (RUNS, None, 200, 200),
    ("GET", f"{RUNS}/{{runId}}"): (f"{RUNS}/{UNKNOWN}", None, 404, 404),
    ("POST", f"{RUNS}/{{runId}}/cancel"): (f"{RUNS}/{UNKNOWN}/cancel", None, 403, 404),
    ("POST", f"{RUNS}/{{runId}}/reset-leases"): (f"{RUNS}/{UNKNOWN}/reset-leases", None, 403, 404),
    ("GET", f"{RUNS}/{{runId}}/failed-items"): (f"{RUNS}/{UNKNOWN}/failed-items", None, 404, 404),
    ("POST", f"{RUNS}/{{runId}}/failed-items/replay"): (
        f"{RUNS}/{UNKNOWN}/failed-items/replay",
        {},
        403,
        404,
    ),
    ("GET", SYNC_ITEMS): (SYNC_ITEMS, None, 200, 200),
    ("POST", f"{SYNC_ITEMS}/replay"): (f"{SYNC_ITEMS}/replay", {}, 403, 200),
    ("GET", TASKS): (TASKS, None, 200, 200),
    ("POST", f"{TASKS}/{{taskId}}/replay"): (f"{TASKS}/{UNKNOWN}/replay", None, 403, 404),
    ("POST", f"{TASKS}/{{taskId}}/discard"): (f"{TASKS}/{UNKNOWN}/discard", None, 403, 404),
    ("GET", "/admin/v1/roles"): ("/admin/v1/roles", None, 200, 200),
    ("GET", "/admin/v1/roles/{roleId}"): (f"/admin/v1/roles/{UNKNOWN}", None, 404, 404),
    ("PUT", "/admin/v1/roles/{roleId}/permissions"): (
        f"/admin/v1/roles/{UNKNOWN}/permissions",
        {"permissions": ["deals.read"]},
        403,
        404,
    ),
    ("GET", "/admin/v1/health/summary"): ("/admin/v1/health/summary", None, 200, 200),
    ("GET", f"{ACCESS}/{{userId}}"): (f"{ACCESS}/{UNKNOWN}", None, 404, 404),
}


def _admin_routes(app: FastAPI) -> set[tuple[str, str]]:
    """Every (method, path) the app routes under /admin/, in the schema or not. Newer FastAPI keeps included
    routers nested (`iter_route_contexts` flattens them); older FastAPI lists every route flat."""
    flatten = getattr(fastapi.routing, "iter_route_contexts", iter)
    return {
        (method, route.path)
        for route in flatten(app.routes)
        if route.path and route.path.startswith("/admin/")
        for method in route.methods or ()
    }


def test_the_role_matrix_names_every_admin_route(admin_container: Container) -> None:
    assert _admin_routes(create_app(admin_container)) == set(ROLE_MATRIX)


@pytest.mark.parametrize("route", list(ROLE_MATRIX), ids=[f"{m} {p}" for m, p in ROLE_MATRIX])
def test_the_role_matrix(client: TestClient, route: tuple[str, str]) -> None:
    """A viewer reads everything and does nothing; an operator does everything; nobody else gets in."""
    path, body, viewer, operator = ROLE_MATRIX[route]
    answered = {}
    for role, token in ROLE_TOKENS.items():
        response = client.request(route[0], path, json=body, headers=bearer(token) if token else {})
        answered[role] = response.status_code
        if response.status_code in (401, 403):
            code = "IDENTITY_UNAUTHORIZED" if role == "none" else "IDENTITY_ADMIN_FORBIDDEN"
            assert_problem(response, response.status_code, code)
    print(f"role matrix: {route[0]:6} {route[1]:55} " + " ".join(f"{r}={s}" for r, s in answered.items()))
    assert answered == {"none": 401, "viewer": viewer, "operator": operator}


def test_a_viewers_action_is_refused_and_logged_before_the_route_runs(client: TestClient) -> None:
    with capture_logs() as logs:
        response = client.post(RUNS, json={"mode": "ApiPull"}, headers=bearer(VIEWER_TOKEN))
    problem = assert_problem(response, 403, "IDENTITY_ADMIN_FORBIDDEN")
    assert problem["detail"] == (
        "operator victor has the role viewer, which may only read; POST needs the role operator"
    )
    assert client.get(RUNS, headers=AUTH).json() == []  # nothing was started
    [refused] = logs
    assert refused["event"] == "admin-forbidden" and refused["who"] == "http:victor"
    assert (refused["role"], refused["method"], refused["path"]) == ("viewer", "POST", RUNS)
    assert not audit_lines(logs) and VIEWER_TOKEN not in str(logs)


def test_whoami_names_the_operator_and_their_role(client: TestClient) -> None:
    answers = [client.get("/admin/v1/whoami", headers=bearer(t)).json() for t in (TOKEN, VIEWER_TOKEN)]
    assert answers == [{"name": "admin", "role": "operator"}, {"name": "victor", "role": "viewer"}]


@pytest.mark.parametrize(("method", "path"), list(ROLE_MATRIX), ids=[f"{m} {p}" for m, p in ROLE_MATRIX])
@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer wrong-token"},
        {"Authorization": f"Basic {TOKEN}"},
        {"Authorization": ""},
        {"Authorization": "Bearer "},
        {"Authorization": f"Bearer {TOKEN}x"},
    ],
    ids=["missing", "wrong", "not-bearer", "empty", "bearer-nothing", "token-prefix"],
)
def test_every_admin_route_needs_the_token(
    client: TestClient, method: str, path: str, headers: dict[str, str]
) -> None:
    called, body, _, _ = ROLE_MATRIX[(method, path)]
    with capture_logs() as logs:
        response = client.request(method, called, json=body, headers=headers)
    assert_problem(response, 401, "IDENTITY_UNAUTHORIZED")
    assert response.headers["www-authenticate"] == "Bearer"
    assert not audit_lines(logs)
    assert [line["event"] for line in logs] == ["admin-auth-failed"]
    assert logs[0]["client"] == "testclient" and "who" not in logs[0]


def test_white_space_around_the_configured_token_is_not_part_of_it(settings: Settings) -> None:
    container = _admin_container(settings, admin_token=f"  {TOKEN}\n")
    try:
        with TestClient(create_app(container)) as padded:
            assert padded.get("/admin/v1/whoami", headers=AUTH).json()["name"] == "admin"
            assert padded.get(TASKS, headers={"Authorization": f"Bearer  {TOKEN} "}).status_code == 200
    finally:
        container.close()


# ---------------------------------------------------------------- metrics, probes, routing


def _sample(text: str, name: str) -> float:
    match = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
    assert match, f"{name} missing"
    return float(match.group(1))


def test_metrics_read_the_database_at_scrape_time(client: TestClient, admin_container: Container) -> None:
    seed.company(admin_container.stores.identity_transactions)  # one CompanyUpserted waits in the outbox
    queued_task(admin_container)
    run_id = start(client, dryRun=True)
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    text = response.text
    assert _sample(text, "identity_outbox_backlog") >= 1
    assert _sample(text, "identity_outbox_oldest_age_seconds") >= 0
    assert _sample(text, "identity_access_fanout_queue_backlog") == 1
    assert _sample(text, "identity_access_fanout_failed_tasks") == 0
    assert _sample(text, "identity_import_running") == 1
    started = client.get(f"{RUNS}/{run_id}", headers=AUTH).json()["startedAt"]
    assert _sample(text, "identity_import_run_started_timestamp_seconds") == pytest.approx(
        datetime.fromisoformat(started).timestamp()
    )


def test_probes(client: TestClient) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200 and ready.json() == {"status": "ready", "warnings": []}


def test_readiness_fails_without_the_database(settings: Settings) -> None:
    container = _admin_container(settings, database_url="postgresql://nobody@127.0.0.1:1/none")
    with TestClient(create_app(container)) as unready:
        response = unready.get("/readyz")
    assert_problem(response, 503, "IDENTITY_NOT_READY")


def test_unknown_routes_and_methods_are_problems_too(client: TestClient) -> None:
    assert_problem(client.get("/nope", headers=AUTH), 404, "IDENTITY_NOT_FOUND")
    for cdn_page in ("/docs", "/redoc", "/docs/oauth2-redirect"):  # removed: they load scripts from a CDN
        assert_problem(client.get(cdn_page), 404, "IDENTITY_NOT_FOUND")
    assert_problem(client.delete(TASKS, headers=AUTH), 405, "IDENTITY_METHOD_NOT_ALLOWED")


def test_the_app_refuses_to_exist_without_an_operator(settings: Settings) -> None:
    for token in (None, "", "  \n"):
        with pytest.raises(
            ConfigurationError, match="PIN_IDENTITY_ADMIN_TOKENS_FILE or PIN_IDENTITY_ADMIN_TOKEN"
        ):
            create_app(Container(settings.model_copy(update={"admin_token": token})))


# ---------------------------------------------------------------- the OpenAPI document


def test_the_openapi_document_is_valid_and_speaks_problem_json(client: TestClient) -> None:
    document = client.get("/openapi.json").json()
    validate(document)
    start_run = document["paths"][RUNS]["post"]
    assert set(start_run["responses"]) >= {"202", "401", "403", "409", "413", "422", "503"}
    assert "403" not in document["paths"][RUNS]["get"]["responses"]  # a viewer may read
    assert start_run["security"] == [{"HTTPBearer": []}]
    for status in ("401", "403", "409", "413", "422", "503"):
        assert start_run["responses"][status]["content"] == {
            "application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}
        }
    assert set(document["components"]["schemas"]["StartImportRun"]["properties"]) >= {
        "mode",
        "talentTenantIdFilter",
        "pageSize",
        "dryRun",
        "correlationId",
    }
    assert "HTTPValidationError" not in document["components"]["schemas"]


def _fuzz_app(settings: Settings, talent_api: SimulatedTalentApi, topics: TalentTopics) -> Container:
    """Both import sources usable, so that no answer is a documented 503 of a missing source."""
    return _admin_container(
        settings,
        talent_api_url=talent_api.url,
        talent_api_token="talent-token",
        talent_tenants_topic=topics.tenants,
        talent_users_topic=topics.users,
        talent_sync_group=topics.group,
        inline_fanout_threshold=0,
    )


def _fuzz_operation(operation: Any, mode: schemathesis.GenerationMode, examples: int) -> None:
    @settings(
        max_examples=examples,
        deadline=None,
        # No example database: every CI run starts from a clean clone, so a saved example would never be
        # replayed there; a failure prints its blob (`@reproduce_failure`) instead, which replays anywhere.
        database=None,
        print_blob=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(generation_mode=mode, headers=dict(AUTH)))
    def no_server_error(case: schemathesis.Case) -> None:
        case.call_and_validate(headers=dict(AUTH), checks=[not_a_server_error])

    try:
        no_server_error()
    except Unsatisfiable:
        if mode is schemathesis.GenerationMode.POSITIVE:
            raise
        # Nothing to make invalid: the operation takes no parameter and no body.


def _fuzz(app: FastAPI, examples: int) -> list[str]:
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    fuzzed = []
    for result in schema.get_all_operations():
        operation = result.ok()
        for mode in (schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE):
            _fuzz_operation(operation, mode, examples)
        fuzzed.append(operation.label)
    return fuzzed


def test_schemathesis_finds_no_server_error(
    settings: Settings, talent_api: SimulatedTalentApi, talent_topics: TalentTopics, database_url: str
) -> None:
    container = _fuzz_app(settings, talent_api, talent_topics)
    try:
        _, task_id = queued_task(container)
        fail_task(database_url, task_id)
        app = create_app(container)
        with TestClient(app) as opened:  # runs the lifespan around the fuzzing
            fuzzed = _fuzz(app, examples=25)
            documented = opened.get("/openapi.json").json()["paths"]
    finally:
        container.close()
    assert len(fuzzed) == sum(len(operations) for operations in documented.values()) >= 21


# ---------------------------------------------------------------- the `serve` command


SERVE = [sys.executable, "-m", "pin_identity.entrypoints.cli", "serve"]


def _serve_once(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`serve` in its own process (it configures the process's logging), from a directory without .env."""
    return subprocess.run(
        [*SERVE, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )


NO_OPERATOR = "error: PIN_IDENTITY_ADMIN_TOKENS_FILE or PIN_IDENTITY_ADMIN_TOKEN: required by serve"


@pytest.mark.parametrize(
    ("file_text", "stderr"),
    [
        (None, NO_OPERATOR),
        ("", "error: PIN_IDENTITY_ADMIN_TOKENS_FILE: cannot read {path} (No such file or directory)"),
        (
            "olga operator\n",
            "error: PIN_IDENTITY_ADMIN_TOKENS_FILE: line 1: 2 fields, expected 3: "
            "<name> <role> <sha256 of the token>",
        ),
        (
            f"olga root {'0' * 64}\n",
            "error: PIN_IDENTITY_ADMIN_TOKENS_FILE: line 1: unknown role 'root' (viewer or operator)",
        ),
    ],
    ids=["neither", "missing-file", "short-line", "unknown-role"],
)
def test_serve_refuses_to_start_without_a_usable_operator(
    subprocess_env: dict[str, str], tmp_path: Path, file_text: str | None, stderr: str
) -> None:
    assert "PIN_IDENTITY_ADMIN_TOKEN" not in subprocess_env
    env = dict(subprocess_env)
    path = tmp_path / "operators"
    if file_text is not None:
        env["PIN_IDENTITY_ADMIN_TOKENS_FILE"] = str(path)
        if file_text:
            path.write_text(file_text)
            path.chmod(0o600)
    result = _serve_once(env, tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip() == stderr.format(path=path)


def test_serve_refuses_a_busy_port(subprocess_env: dict[str, str], tmp_path: Path) -> None:
    env = {**subprocess_env, "PIN_IDENTITY_ADMIN_TOKEN": TOKEN}
    with socket.create_server(("127.0.0.1", 0)) as busy:
        result = _serve_once(env, tmp_path, "--port", str(busy.getsockname()[1]))
    assert result.returncode == 2
    assert result.stderr.strip().startswith("error: --host/--port: cannot listen on 127.0.0.1:")


def test_serve_answers_over_http_and_stops_on_sigterm(subprocess_env: dict[str, str]) -> None:
    port = free_port()
    env = {**subprocess_env, "PIN_IDENTITY_ADMIN_TOKEN": TOKEN}
    server = subprocess.Popen(
        [*SERVE, "--port", str(port)],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        health = wait_for_healthz(base, "serve")
        assert health.status_code == 200
        assert httpx.get(f"{base}{TASKS}", headers=AUTH, timeout=5).json() == []
        assert httpx.get(f"{base}{TASKS}", timeout=5).status_code == 401
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=30) == 0
        assert server.stderr is not None
        logged = server.stderr.read()
    finally:
        server.kill()
    assert '"event": "admin-api-started"' in logged and TOKEN not in logged


def _whoami(base: str, token: str) -> httpx.Response:
    return httpx.get(f"{base}/admin/v1/whoami", headers=bearer(token), timeout=5)


def test_tokens_rotated_in_the_file_take_effect_while_serve_runs(
    subprocess_env: dict[str, str], tmp_path: Path
) -> None:
    """Added, rotated and removed tokens are in force within 10 s, without a restart; a broken edit keeps only
    the operators whose line it left unchanged, says so in one log line, on /readyz and in /metrics, until it
    is fixed."""
    tokens = write_tokens_file(
        tmp_path / "operators", {"alice": ("operator", "alice-1"), "bob": ("viewer", "bob-1")}
    )
    port = free_port()
    env = {**subprocess_env, "PIN_IDENTITY_ADMIN_TOKENS_FILE": str(tokens)}
    log = tmp_path / "serve.log"
    with log.open("w") as stderr:
        server = subprocess.Popen([*SERVE, "--port", str(port)], env=env, stderr=stderr)
    try:
        base = f"http://127.0.0.1:{port}"
        wait_for_healthz(base, "serve")
        assert _whoami(base, "alice-1").json() == {"name": "alice", "role": "operator"}
        assert _whoami(base, "bob-1").json() == {"name": "bob", "role": "viewer"}

        edited = time.monotonic()
        write_tokens_file(tokens, {"alice": ("operator", "alice-2"), "carol": ("viewer", "carol-1")})
        wait_until(
            lambda: _whoami(base, "alice-2").status_code == 200, "the rotated token works", timeout_s=10
        )
        took_s = time.monotonic() - edited
        print(f"rotation in force after {took_s:.2f} s")
        assert [_whoami(base, token).status_code for token in ("alice-1", "bob-1")] == [401, 401]
        assert _whoami(base, "carol-1").json() == {"name": "carol", "role": "viewer"}

        # A broken edit that also removes carol: her removal does not wait for the fix.
        kept = [line for line in tokens.read_text().splitlines(keepends=True) if not line.startswith("carol")]
        tokens.write_text("".join(kept) + "dave operator not-a-digest\n")
        readyz = lambda: httpx.get(f"{base}/readyz", timeout=5)  # noqa: E731
        wait_until(lambda: readyz().json()["warnings"] != [], "/readyz names the broken file", timeout_s=10)
        ready = readyz()
        assert ready.status_code == 200
        assert ready.json()["warnings"] == [
            "PIN_IDENTITY_ADMIN_TOKENS_FILE: line 3: the third field is not a sha256 (64 hex digits); "
            "only the operators whose line is unchanged stay in force"
        ]
        assert [_whoami(base, token).status_code for token in ("alice-2", "carol-1")] == [200, 401]
        assert _sample(httpx.get(f"{base}/metrics").text, "identity_admin_tokens_file_load_error") == 1

        write_tokens_file(tokens, {"alice": ("operator", "alice-2")})
        wait_until(
            lambda: readyz().json()["warnings"] == [], "/readyz no longer names the file", timeout_s=10
        )
        assert _sample(httpx.get(f"{base}/metrics").text, "identity_admin_tokens_file_load_error") == 0
        assert _whoami(base, "carol-1").status_code == 401
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=30) == 0
    finally:
        server.kill()
        server.wait()
    events = [json.loads(line)["event"] for line in log.read_text().splitlines() if line.startswith("{")]
    assert events.count("admin-operators-file-invalid") == 1
    assert events.count("admin-operators-reloaded") == 2
    logged = log.read_text()
    for token in ("alice-1", "alice-2", "bob-1", "carol-1"):
        assert token not in logged and hashlib.sha256(token.encode()).hexdigest() not in logged


# ---------------------------------------------------------------- admission before the body, on real sockets


@dataclass(frozen=True)
class Served:
    port: int
    log: Path

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@pytest.fixture
def served(subprocess_env: dict[str, str], tmp_path: Path) -> Iterator[Served]:
    """`serve` in its own process, as in production (where uvicorn decides when a body is read); its log
    goes to a file."""
    port = free_port()
    tokens = write_tokens_file(tmp_path / "operators", OPERATORS)
    env = {**subprocess_env, "PIN_IDENTITY_ADMIN_TOKEN": TOKEN, "PIN_IDENTITY_ADMIN_TOKENS_FILE": str(tokens)}
    log = tmp_path / "serve.log"
    with log.open("w") as stderr:
        server = subprocess.Popen([*SERVE, "--port", str(port)], env=env, stderr=stderr)
    try:
        wait_for_healthz(f"http://127.0.0.1:{port}", "serve")
        yield Served(port, log)
    finally:
        server.kill()
        server.wait()


SCRAPES = 500
ROOT = Path(__file__).resolve().parents[2]


def _probe_timeout_s() -> float:
    """What the kubelet waits for serve's /healthz (deploy/kubernetes/serve.yaml, livenessProbe): a probe
    slower than that counts as failed."""
    documents = yaml.safe_load_all((ROOT / "deploy" / "kubernetes" / "serve.yaml").read_text())
    [deployment] = [d for d in documents if d and d["kind"] == "Deployment"]
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    return float(container["livenessProbe"]["timeoutSeconds"])


def _probe_healthz(kubelet: httpx.Client, number: int, timeout_s: float) -> float:
    """Seconds /healthz took to answer 200; fails the test past the probe's timeout."""
    asked = time.monotonic()
    try:
        answer = kubelet.get("/healthz")
    except httpx.TimeoutException:
        pytest.fail(f"/healthz did not answer within {timeout_s} s (probe {number})")
    took_s = time.monotonic() - asked
    assert answer.status_code == 200 and took_s < timeout_s, f"/healthz took {took_s:.2f} s (probe {number})"
    return took_s


@pytest.mark.slow
def test_a_flood_of_scrapes_leaves_healthz_answering_within_the_probes_timeout(served: Served) -> None:
    """/metrics cannot be used to starve the liveness probe (nor to load the database: gauges): while 500
    scrapes are in flight, /healthz, asked again and again on a fresh connection as a kubelet does, answers
    each time within the timeout the deployment gives the probe (2 s; one probe failing is not yet a restart,
    which takes three in a row: this asks more). On this 2-core machine the slowest of ~3,000 probes takes
    0.2-0.35 s; the suite's other processes on the same cores once made one take over 1 s."""
    timeout_s = _probe_timeout_s()
    # The load generator gives way to serve and to the probe on a busy 2-core machine: what is measured is
    # serve's answer, not how the scheduler shares the cores with 500 clients.
    flood = subprocess.Popen(
        ["nice", "-n", "10", sys.executable, "-m", "tests.support.scrapes", served.base, str(SCRAPES)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    took_s: list[float] = []
    fresh_connections = httpx.Limits(max_keepalive_connections=0)
    try:
        assert flood.stdout is not None and flood.stdout.readline() == "started\n"
        with httpx.Client(base_url=served.base, timeout=timeout_s, limits=fresh_connections) as kubelet:

            def scrapes_ended() -> bool:
                if flood.poll() is not None:
                    return True
                took_s.append(_probe_healthz(kubelet, len(took_s) + 1, timeout_s))
                return False

            wait_until(scrapes_ended, "the scrapes ended", timeout_s=180, every_s=0)
        report = json.loads(flood.stdout.read())
    finally:
        flood.kill()
        flood.wait()
    print(f"/healthz during {SCRAPES} scrapes: {len(took_s)} probes, slowest {max(took_s):.3f} s")
    assert len(took_s) >= 3  # the probes did meet the flood
    assert report == {"statuses": [200] * SCRAPES, "withOutboxBacklog": SCRAPES}


def _head_only(method: str, path: str, headers: dict[str, str]) -> bytes:
    """A request line and headers, without the body they announce."""
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _answered(raw: bytes) -> bool:
    head, separator, body = raw.partition(b"\r\n\r\n")
    length = re.search(rb"(?im)^content-length:\s*(\d+)", head)
    return bool(separator and length and len(body) >= int(length.group(1)))


def _as_response(raw: bytes) -> httpx.Response:
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = [(name.strip(), value.strip()) for name, value in (line.split(":", 1) for line in lines)]
    return httpx.Response(int(status_line.split()[1]), headers=headers, content=body)


def _exchange_head(port: int, head: bytes, within_s: float) -> tuple[httpx.Response, float]:
    """Sends `head` alone and reads the answer: (the answer, seconds it took). Fails the test when none
    comes within `within_s`, as when the server waits for the body first."""
    started = time.monotonic()
    raw = b""
    with socket.create_connection(("127.0.0.1", port), timeout=within_s) as conn:
        conn.sendall(head)
        try:
            while not _answered(raw) and (chunk := conn.recv(65536)):
                raw += chunk
        except TimeoutError:
            pytest.fail(f"no answer within {within_s} s; received {raw[:200]!r}")
    return _as_response(raw), time.monotonic() - started


@pytest.mark.parametrize(
    ("method", "path", "authorization", "status", "code"),
    [
        ("POST", RUNS, "Bearer wrong-token", 401, "IDENTITY_UNAUTHORIZED"),
        ("PUT", f"/admin/v1/roles/{UNKNOWN}/permissions", None, 401, "IDENTITY_UNAUTHORIZED"),
        ("POST", RUNS, f"Bearer {VIEWER_TOKEN}", 403, "IDENTITY_ADMIN_FORBIDDEN"),
        ("POST", RUNS, f"Bearer {TOKEN}", 413, "IDENTITY_REQUEST_TOO_LARGE"),
    ],
    ids=["unauthenticated-post", "unauthenticated-put", "viewer-post", "authenticated-post"],
)
def test_a_1_gib_body_is_refused_before_a_byte_of_it_is_sent(
    served: Served, method: str, path: str, authorization: str | None, status: int, code: str
) -> None:
    headers = {"Content-Type": "application/json", "Content-Length": str(GIB)}
    if authorization is not None:
        headers["Authorization"] = authorization
    response, took_s = _exchange_head(served.port, _head_only(method, path, headers), within_s=1.0)
    assert took_s < 1.0
    assert_problem(response, status, code)
    assert response.headers["connection"] == "close"  # the body is not waited for either
    logged = served.log.read_text()
    assert ('"event": "admin-auth-failed"' in logged) == (status == 401)
    assert ('"event": "admin-forbidden"' in logged) == (status == 403)
    assert TOKEN not in logged and VIEWER_TOKEN not in logged


def _padded_start(size: int) -> bytes:
    """A start request of exactly `size` bytes of JSON (the padding member is ignored by the API)."""
    frame = json.dumps({"mode": "ApiPull", "padding": ""}).encode()
    return frame.replace(b'"padding": ""', b'"padding": "' + b"x" * (size - len(frame)) + b'"')


def _in_chunks(body: bytes, size: int = 64 * 1024) -> Iterator[bytes]:
    """A generator body: httpx sends it chunked, without Content-Length."""
    for start in range(0, len(body), size):
        yield body[start : start + size]


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_an_authenticated_body_over_1_mib_is_413(served: Served, chunked: bool) -> None:
    body = _padded_start(MIB + 1)
    headers = {**AUTH, "Content-Type": "application/json"}
    response = httpx.post(
        f"{served.base}{RUNS}", content=_in_chunks(body) if chunked else body, headers=headers
    )
    problem = assert_problem(response, 413, "IDENTITY_REQUEST_TOO_LARGE")
    assert problem["instance"] == RUNS
    assert ("content-length" not in response.request.headers) == chunked  # chunked: no size announced


def test_a_body_of_exactly_1_mib_is_read(client: TestClient, talent_api: SimulatedTalentApi) -> None:
    talent_api.healthy = False  # a run is not wanted: the answer only shows that the body was read
    headers = {**AUTH, "Content-Type": "application/json"}
    response = client.post(RUNS, content=_padded_start(MIB), headers=headers)
    assert_problem(response, 503, "IDENTITY_IMPORT_SOURCE_UNAVAILABLE")
