"""Logs carry ids, codes and masked phones, never contacts: everything the consumer and the import print, over
snapshots full of phones, e-mails and names (poison items included), is searched for each of them."""

from __future__ import annotations

import contextlib
import json
from typing import Any

from pin_identity.domain.phone import InvalidPhoneError, normalize_phone
from pin_identity.simulation.talent import TalentDataset, generate_dataset
from tests.acceptance.test_cli import run_cli
from tests.support.talent_import import TalentWorld


def _personal_data(dataset: TalentDataset) -> set[str]:
    values: set[str] = set()
    for user in dataset.users:
        for field in ("phone", "email", "firstName", "lastName", "middleName"):
            if isinstance(user.get(field), str) and len(user[field]) > 3:
                values.add(user[field])
        with contextlib.suppress(InvalidPhoneError):
            values.add(normalize_phone(user["phone"]))
    # JSON logs escape non-ASCII text: look for the escaped spelling too.
    return values | {json.dumps(value)[1:-1] for value in values}


def _leaks(output: str, personal: set[str]) -> list[str]:
    return sorted(value for value in personal if value in output)


def _env(subprocess_env: dict[str, str], world: TalentWorld) -> dict[str, Any]:
    return {
        **subprocess_env,
        "PIN_IDENTITY_TALENT_API_URL": world.api.url,
        "PIN_IDENTITY_TALENT_API_TOKEN": "talent-token",
        "PIN_IDENTITY_TALENT_TENANTS_TOPIC": world.topics.tenants,
        "PIN_IDENTITY_TALENT_USERS_TOPIC": world.topics.users,
        "PIN_IDENTITY_TALENT_SYNC_GROUP": world.topics.group,
        "PIN_IDENTITY_KAFKA_CONFIG": json.dumps({"session.timeout.ms": 6000}),
    }


def test_the_consumer_and_the_import_log_no_contact_data(
    subprocess_env: dict[str, str], api_world: TalentWorld
) -> None:
    dataset = generate_dataset(5, 40, seed=41, poison=True)
    api_world.publish(dataset)
    env = _env(subprocess_env, api_world)
    personal = _personal_data(dataset)

    consumer = run_cli(env, "worker", "--jobs", "talent-sync,outbox-relay", "--once", timeout=120)
    replay = run_cli(env, "talent-import", "run", "--mode", "api-pull", "--page-size", "7", timeout=120)
    status = run_cli(env, "talent-import", "status", "--json")
    run_id = json.loads(status.stdout)["runId"]
    quarantine = run_cli(env, "talent-import", "failed-items", run_id)

    assert consumer.returncode == 0, consumer.stderr[-2000:]
    assert replay.returncode == 0, replay.stderr[-2000:]
    assert '"item-quarantined"' in consumer.stderr + replay.stderr  # the poison was logged, by id and code
    for result in (consumer, replay, status, quarantine):
        assert _leaks(result.stdout + result.stderr, personal) == []
