"""No contact data in any output of any process that sees it: the consumer and the relay publishing its
`UserUpserted` events (a dead-lettered one too), both import modes, the fan-out worker (a failing batch
too), `serve` (4xx and 5xx answers) and the demo. Every stream is searched for every phone in each form
Talent writes and in E.164, every e-mail, person's name and tax id, as written and JSON-escaped. Where a
log must refer to a phone it masks it (`+7***6789`); ids and codes are what logs carry."""

from __future__ import annotations

import contextlib
import json
import subprocess
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from pin_identity.adapters.kafka.embedded_kafka import free_port
from pin_identity.domain.phone import InvalidPhoneError, normalize_phone
from pin_identity.simulation.simulated_talent import TalentDataset, generate_dataset
from tests.support.cli import CLI, run_cli
from tests.support.health import wait_for_healthz
from tests.support.relay import outbox_count
from tests.support.talent_import import TalentWorld
from tests.support.waiting import wait_until

TOKEN = "secret-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}

# ---------------------------------------------------------------- what must not appear


def _phone_forms(phone: str) -> set[str]:
    """A phone as written and, for a Russian number, each form Talent writes it in (CONTRACTS section 5)."""
    forms = {phone}
    with contextlib.suppress(InvalidPhoneError):
        e164 = normalize_phone(phone)
        national = e164.removeprefix("+7")
        forms |= {e164, national}
        if len(national) == 10:
            d = national
            forms |= {f"({d[:3]}) {d[3:6]}-{d[6:8]}-{d[8:]}", f"{d[:3]} {d[3:6]} {d[6:8]} {d[8:]}"}
    return forms


def _escaped(values: Iterable[str]) -> set[str]:
    """JSON logs escape non-ASCII text: look for the escaped spelling too."""
    kept = {value for value in values if len(value) > 3}
    return kept | {json.dumps(value)[1:-1] for value in kept}


def _of_dataset(dataset: TalentDataset) -> set[str]:
    values: set[str] = set()
    for user in dataset.users:
        values |= {
            user[f] for f in ("email", "firstName", "lastName", "middleName") if isinstance(user[f], str)
        }
        values |= _phone_forms(user["phone"]) if isinstance(user["phone"], str) else set()
    values |= {tenant["taxId"] for tenant in dataset.tenants if isinstance(tenant.get("taxId"), str)}
    return _escaped(values)


def _of_database(database_url: str) -> set[str]:
    values: set[str] = set()
    with psycopg.connect(database_url) as conn:
        for row in conn.execute(
            "SELECT phone, email, first_name, last_name, middle_name FROM identity.users"
        ):
            values |= _phone_forms(row[0]) | {value for value in row[1:] if value}
        values |= {row[0] for row in conn.execute("SELECT tax_id FROM identity.companies") if row[0]}
    return _escaped(values)


def _assert_no_leaks(personal: set[str], *outputs: str) -> None:
    assert len(personal) > 20  # the search has something to find
    for output in outputs:
        assert output, "an output stream to search"
        leaks = sorted(value for value in personal if value in output)
        assert leaks == [], f"{len(leaks)} contact values in: {output[-1500:]}"


def _streams(*results: subprocess.CompletedProcess[str]) -> list[str]:
    return [result.stdout + result.stderr for result in results]


def _env(subprocess_env: dict[str, str], world: TalentWorld, **kafka: object) -> dict[str, Any]:
    return {
        **subprocess_env,
        "PIN_IDENTITY_TALENT_API_URL": world.api.url,
        "PIN_IDENTITY_TALENT_API_TOKEN": "talent-token",
        "PIN_IDENTITY_TALENT_TENANTS_TOPIC": world.topics.tenants,
        "PIN_IDENTITY_TALENT_USERS_TOPIC": world.topics.users,
        "PIN_IDENTITY_TALENT_SYNC_GROUP": world.topics.group,
        "PIN_IDENTITY_KAFKA_CONFIG": json.dumps({"session.timeout.ms": 6000, **kafka}),
    }


def _ok(result: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert result.returncode == 0, result.stderr[-2000:]
    return result


# ---------------------------------------------------------------- the consumer, the relay, the imports


def _oversized_user_upserted(database_url: str) -> None:
    """A copy of an outbox `UserUpserted` padded past the producer's message.max.bytes: dead-lettered."""
    with psycopg.connect(database_url) as conn:
        conn.execute(
            """INSERT INTO identity.outbox_events
                   (event_id, topic, message_key, event_type, correlation_id, value, created_at)
               SELECT %s, topic, message_key, event_type, correlation_id,
                      jsonb_set(value::jsonb, '{padding}', to_jsonb(repeat(value, 40)))::text, created_at
               FROM identity.outbox_events WHERE event_type = 'UserUpserted' ORDER BY id LIMIT 1""",
            (uuid.uuid4(),),
        )


def test_the_consumer_its_relay_and_the_api_pull_import_log_no_contact_data(
    subprocess_env: dict[str, str], api_world: TalentWorld
) -> None:
    dataset = generate_dataset(5, 40, seed=41, poison=True)
    api_world.publish(dataset)
    env = _env(subprocess_env, api_world, **{"message.max.bytes": 20_000})
    database_url = subprocess_env["PIN_IDENTITY_DATABASE_URL"]

    consumer = _ok(run_cli(env, "worker", "--jobs", "talent-sync", "--once", timeout=120))
    assert outbox_count(database_url) > 40  # the relay below starts with the outbox full of UserUpserted
    _oversized_user_upserted(database_url)
    relay = _ok(run_cli(env, "worker", "--jobs", "outbox-relay", "--once", timeout=120))
    assert (outbox_count(database_url), outbox_count(database_url, "outbox_dead_letters")) == (0, 1)
    assert '"outbox-event-dead-lettered"' in relay.stderr
    failed = _ok(run_cli(env, "talent-import", "failed-items", "--consumer", "--json"))
    replayed = run_cli(env, "talent-import", "replay-failed", "--consumer")  # the phone conflicts again
    replay = _ok(run_cli(env, "talent-import", "run", "--mode", "api-pull", "--page-size", "7", timeout=120))
    status = _ok(run_cli(env, "talent-import", "status", "--json"))
    quarantine = _ok(run_cli(env, "talent-import", "failed-items", json.loads(status.stdout)["runId"]))

    assert '"item-quarantined"' in consumer.stderr + replay.stderr  # the poison was logged, by id and code
    assert "IDENTITY_SYNC_PHONE_CONFLICT" in failed.stdout
    _assert_no_leaks(
        _of_dataset(dataset) | _of_database(database_url),
        *_streams(consumer, relay, failed, replayed, replay, status, quarantine),
    )


def test_topic_replay_logs_no_contact_data(subprocess_env: dict[str, str], replay_world: TalentWorld) -> None:
    dataset = generate_dataset(5, 40, seed=43, poison=True)
    replay_world.publish(dataset)
    env = _env(subprocess_env, replay_world)

    replay = _ok(
        run_cli(env, "talent-import", "run", "--mode", "topic-replay", "--page-size", "7", timeout=120)
    )
    status = _ok(run_cli(env, "talent-import", "status", "--json"))
    quarantine = _ok(run_cli(env, "talent-import", "failed-items", json.loads(status.stdout)["runId"]))

    assert json.loads(status.stdout)["mode"] == "TopicReplay"
    assert '"item-quarantined"' in replay.stderr
    _assert_no_leaks(
        _of_dataset(dataset) | _of_database(subprocess_env["PIN_IDENTITY_DATABASE_URL"]),
        *_streams(replay, status, quarantine),
    )


# ---------------------------------------------------------------- the fan-out worker and serve, failing too

_REFUSE_ACCESS_EVENTS = """
CREATE FUNCTION identity.refuse_access_events() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    victim record;
BEGIN
    SELECT phone, email INTO victim FROM identity.users WHERE email IS NOT NULL ORDER BY id LIMIT 1;
    RAISE EXCEPTION 'refused for % (%)', victim.phone, victim.email;
END $$;
CREATE TRIGGER refuse_access_events BEFORE INSERT ON identity.outbox_events
    FOR EACH ROW WHEN (NEW.event_type = 'UserAccessChanged') EXECUTE FUNCTION identity.refuse_access_events();
"""


def _claimable(database_url: str) -> bool:
    with psycopg.connect(database_url) as conn:
        row = conn.execute(
            "SELECT bool_and(lease_expires_at <= now()) FROM identity.access_fanout_tasks"
        ).fetchone()
    return bool(row and row[0])


def _largest_role(database_url: str) -> str:
    with psycopg.connect(database_url) as conn:
        row = conn.execute(
            "SELECT role_id FROM identity.role_assignments GROUP BY role_id ORDER BY count(*) DESC LIMIT 1"
        ).fetchone()
    assert row is not None
    return str(row[0])


@contextlib.contextmanager
def _serving(env: dict[str, str], log: Path) -> Iterator[str]:
    port = free_port()
    with log.open("w") as stderr:
        server = subprocess.Popen([*CLI, "serve", "--port", str(port)], env=env, stderr=stderr, stdout=stderr)
    try:
        base = f"http://127.0.0.1:{port}"
        wait_for_healthz(base, "serve")
        yield base
    finally:
        server.kill()
        server.wait()


def _hostile_requests(base: str, role_id: str, phone: str, email: str) -> list[int]:
    """Answers that carry the caller's contact data back at it, and a 500: none of it may reach the log."""
    roles = f"{base}/admin/v1/roles/{role_id}/permissions"
    with httpx.Client(timeout=30) as client:
        return [
            client.get(f"{base}/admin/v1/access-fanout/tasks", headers={"Authorization": phone}).status_code,
            client.get(f"{base}/admin/v1/access-fanout/tasks?status={email}", headers=AUTH).status_code,
            client.get(f"{base}/admin/v1/talent-import/runs/{phone}", headers=AUTH).status_code,
            client.put(roles, json={"permissions": phone}, headers=AUTH).status_code,
            client.put(roles, json={"permissions": [phone, email]}, headers=AUTH).status_code,
        ]


def test_the_fanout_worker_and_serve_log_no_contact_data_even_failing(
    subprocess_env: dict[str, str], api_world: TalentWorld, tmp_path: Path
) -> None:
    dataset = generate_dataset(4, 60, seed=47)
    api_world.publish(dataset)
    env = {**_env(subprocess_env, api_world), "PIN_IDENTITY_ADMIN_TOKEN": TOKEN}
    database_url = env["PIN_IDENTITY_DATABASE_URL"]
    _ok(run_cli(env, "talent-import", "run", "--mode", "api-pull", timeout=120))
    role_id = _largest_role(database_url)
    with psycopg.connect(database_url) as conn:
        conn.execute(_REFUSE_ACCESS_EVENTS)
    user = dataset.users[0]

    with _serving({**env, "PIN_IDENTITY_INLINE_FANOUT_THRESHOLD": "1000"}, tmp_path / "serve.log") as base:
        answers = _hostile_requests(base, role_id, normalize_phone(user["phone"]), "anna@example.com")
    queued = _ok(
        run_cli(
            {**env, "PIN_IDENTITY_INLINE_FANOUT_THRESHOLD": "0"},
            "roles",
            "set-permissions",
            role_id,
            "deals.read",
        )
    )
    failing = _ok(run_cli(env, "worker", "--jobs", "access-fanout", "--once", timeout=120))
    with psycopg.connect(database_url) as conn:
        conn.execute("DROP TRIGGER refuse_access_events ON identity.outbox_events")
    tasks = _ok(run_cli(env, "fanout", "list", "--json"))
    assert json.loads(tasks.stdout)[0]["lastError"]  # the failed attempt, described without its contacts
    wait_until(lambda: _claimable(database_url), "the failed attempt's back-off has passed", timeout_s=60)
    healed = _ok(run_cli(env, "worker", "--jobs", "access-fanout,outbox-relay", "--once", timeout=120))

    assert answers == [401, 422, 422, 422, 500]
    assert '"fanout-task-failed"' in failing.stderr
    assert outbox_count(database_url) == 0 and '"fanout-task-completed"' in healed.stderr
    _assert_no_leaks(
        _of_dataset(dataset) | _of_database(database_url),
        (tmp_path / "serve.log").read_text(),
        *_streams(queued, failing, tasks, healed),
    )


# ---------------------------------------------------------------- the demo


@pytest.mark.timeout(240)
def test_the_demo_prints_no_contact_data(subprocess_env: dict[str, str], own_broker: str) -> None:
    env = {**subprocess_env, "PIN_IDENTITY_KAFKA_BOOTSTRAP_SERVERS": own_broker}
    demo = _ok(run_cli(env, "demo", "--companies", "3", "--users", "250", "--verbose", timeout=200))
    assert "PASS" in demo.stdout
    _assert_no_leaks(
        _of_dataset(generate_dataset(3, 250, seed=2026, poison=True))
        | _of_database(subprocess_env["PIN_IDENTITY_DATABASE_URL"]),
        demo.stdout,
        demo.stderr,
    )
