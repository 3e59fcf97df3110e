"""Traces leave the process: `worker` and `talent-import run` export their spans over OTLP (HTTP/protobuf and
gRPC, the SDK's own exporters) to a real Jaeger, which the test starts and reads back through its query API.
The spans of a fan-out and of an import page arrive with their attributes and parent links, and the
`traceparent` header of the Kafka records they wrote names them."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from pin_identity.composition.stores import Stores
from pin_identity.domain.fanout_policy import FanOutPath, FanOutPolicy
from pin_identity.simulation.simulated_talent import generate_dataset
from tests.support import seed
from tests.support.cli import run_cli
from tests.support.jaeger import Jaeger, Span, running_jaeger
from tests.support.kafka_tap import EventTap
from tests.support.talent_import import TalentWorld
from tests.support.waiting import first_answer

pytestmark = pytest.mark.timeout(240)


@pytest.fixture
def jaeger(tmp_path: Path) -> Iterator[Jaeger]:
    with running_jaeger(tmp_path) as started:
        yield started


def _traced(env: dict[str, str], protocol: str, endpoint: str) -> tuple[dict[str, str], str]:
    """The environment of a process exporting its spans to `endpoint`, under a service name of its own."""
    service = f"pin-identity-{uuid.uuid4().hex[:8]}"
    return {
        **env,
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
        "OTEL_SERVICE_NAME": service,
    }, service


def _traceparent(trace_id: str, span_id: str) -> str:
    """The W3C traceparent naming a span, its flags left out (sampled, and maybe the random-trace-id flag)."""
    return f"00-{trace_id}-{span_id}"


def _names(traceparent: str) -> str:
    return traceparent.rsplit("-", 1)[0]


def test_a_fan_out_exports_its_task_and_batch_spans_and_its_records_name_them(
    stores: Stores, subprocess_env: dict[str, str], database_url: str, tap: EventTap, jaeger: Jaeger
) -> None:
    company = seed.company(stores.identity_transactions)
    role = seed.role(stores.identity_transactions, company)
    users = {str(u) for u in seed.bulk_role_members(database_url, role, company, 25)}
    change = seed.change_permissions(stores.identity_transactions, role, ["deals.read"], FanOutPolicy(0))
    assert change.path is FanOutPath.QUEUED
    env, service = _traced(subprocess_env, "http/protobuf", jaeger.otlp_http)
    env["PIN_IDENTITY_FANOUT_BATCH_SIZE"] = "10"

    worker = run_cli(env, "worker", "--jobs", "access-fanout,outbox-relay", "--once", timeout=120)
    assert worker.returncode == 0, worker.stderr[-2000:]

    def fan_out() -> list[Span] | None:
        spans = jaeger.spans(service, operation="access-fanout.task")
        return spans if len([s for s in spans if s.name == "access-fanout.batch"]) == 3 else None

    spans = first_answer(fan_out, "Jaeger has the fan-out's task and its 3 batches", timeout_s=60)
    [task] = [s for s in spans if s.name == "access-fanout.task"]
    batches = [s for s in spans if s.name == "access-fanout.batch"]
    assert task.parent_id is None
    assert task.attributes["taskId"] == str(change.task_id)
    assert task.attributes["roleId"] == str(role)
    assert task.attributes["batchSize"] == 10
    assert task.attributes["processedCount"] == 25
    assert uuid.UUID(task.attributes["jobRunId"])
    assert sorted(b.attributes["processedCount"] for b in batches) == [5, 10, 10]
    assert {(b.trace_id, b.parent_id) for b in batches} == {(task.trace_id, task.span_id)}

    events = tap.wait_for(lambda e: e.key in users, 25, timeout_s=60)
    named = {_names(event.headers["traceparent"]) for event in events}
    assert named == {_traceparent(b.trace_id, b.span_id) for b in batches}
    # The correlation id is the claim's jobRunId, as on the task span.
    assert {event.headers["correlation-id"] for event in events} == {task.attributes["jobRunId"]}
    print_spans("fan-out", spans, events[0].headers["traceparent"])


def test_an_import_exports_run_stage_page_and_write_spans_and_its_records_name_them(
    subprocess_env: dict[str, str], api_world: TalentWorld, database_url: str, tap: EventTap, jaeger: Jaeger
) -> None:
    api_world.publish(generate_dataset(3, 5, seed=46))
    env = {
        **subprocess_env,
        "PIN_IDENTITY_TALENT_API_URL": api_world.api.url,
        "PIN_IDENTITY_TALENT_API_TOKEN": "talent-token",
    }
    traced_env, service = _traced(env, "grpc", jaeger.otlp_grpc)

    imported = run_cli(traced_env, "talent-import", "run", "--mode", "api-pull", "--page-size", "2", "--json")
    assert imported.returncode == 0, imported.stderr[-2000:]
    run_id = json.loads(imported.stdout)["runId"]
    relay = run_cli(subprocess_env, "worker", "--jobs", "outbox-relay", "--once", timeout=120)
    assert relay.returncode == 0, relay.stderr[-2000:]
    with psycopg.connect(database_url) as conn:
        [(correlation_id,)] = conn.execute(
            "SELECT correlation_id::text FROM identity.talent_import_runs WHERE id = %s", [run_id]
        ).fetchall()
        users = {str(u) for (u,) in conn.execute("SELECT id FROM identity.users").fetchall()}

    pages = first_answer(
        lambda: jaeger.spans(service, operation="talent-import.page") or None,
        "Jaeger has the import's pages",
        timeout_s=60,
    )
    trace_id = pages[0].trace_id

    def whole_trace() -> list[Span] | None:
        spans = jaeger.trace(trace_id)
        names = [s.name for s in spans]
        # 2 Tenants pages and 3 Users pages, each with its read and write span; the run and both stages.
        complete = names.count("talent-import.page") == 5 and names.count("talent-import.write") == 5
        return spans if complete and "talent-import.run" in names else None

    spans = first_answer(whole_trace, "Jaeger has the import's whole trace", timeout_s=60)
    by_id = {s.span_id: s for s in spans}
    [run] = [s for s in spans if s.name == "talent-import.run"]
    stages = {s.attributes["stage"]: s for s in spans if s.name == "talent-import.stage"}
    assert run.parent_id is None
    assert run.attributes["runId"] == run_id and run.attributes["status"] == "Completed"
    assert run.attributes["correlationId"] == correlation_id
    assert set(stages) == {"Tenants", "Users"}
    assert {s.parent_id for s in stages.values()} == {run.span_id}
    users_pages = [s for s in spans if s.name == "talent-import.page" and s.attributes["stage"] == "Users"]
    assert sorted(p.attributes["pageNo"] for p in users_pages) == [0, 1, 2]
    for page in [s for s in spans if s.name == "talent-import.page"]:
        assert page.parent_id == stages[page.attributes["stage"]].span_id
        assert page.attributes["runId"] == run_id and page.attributes["correlationId"] == correlation_id
    for child in [s for s in spans if s.name in {"talent-import.read", "talent-import.write"}]:
        assert by_id[child.parent_id or ""].name == "talent-import.page"
    assert sum(p.attributes["itemsApplied"] for p in users_pages) == 5

    events = tap.wait_for(lambda e: e.key in users and e.topic == "pin.identity.users.v1", 5, timeout_s=60)
    users_writes = {
        _traceparent(s.trace_id, s.span_id): s
        for s in spans
        if s.name == "talent-import.write" and by_id[s.parent_id or ""].attributes["stage"] == "Users"
    }
    for event in events:
        assert _names(event.headers["traceparent"]) in users_writes, event.headers
        assert event.headers["correlation-id"] == correlation_id
    print_spans("import", spans, events[0].headers["traceparent"])


def print_spans(what: str, spans: list[Span], traceparent: str) -> None:
    """What Jaeger returned, for the record (`pytest -s` shows it)."""
    print(f"\n{what}: a record's traceparent {traceparent}")
    for span in sorted(spans, key=lambda s: (s.parent_id is not None, s.name)):
        print(f"  {span.name} {span.span_id} parent={span.parent_id} {span.attributes}")
