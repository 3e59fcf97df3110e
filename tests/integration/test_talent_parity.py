"""Parity: the same Talent data through ApiPull, TopicReplay and the continuous consumer gives identical
replica rows and identical pin.identity.* events; the import racing the consumer changes nothing."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

from pin_identity.composition import Container
from pin_identity.domain.import_run import ImportMode, ImportRequest, RunStatus
from pin_identity.domain.phone import InvalidPhoneError, normalize_phone
from pin_identity.simulation.simulated_talent import SimulatedTalentApi, TalentDataset, generate_dataset
from tests.support import talent
from tests.support.clocks import ManualClock
from tests.support.talent import TalentTopics
from tests.support.talent_import import TalentWorld, run_to_end


def _dataset() -> TalentDataset:
    """Poison whose outcome does not depend on arrival order. Two Talent users with one phone do: the first
    applied keeps it and the other is quarantined (R6), and the three paths deliver in different orders."""
    dataset = generate_dataset(6, 60, seed=21, poison=True)
    phones = [_phone(u) for u in dataset.users]
    users = [
        u for u, phone in zip(dataset.users, phones, strict=True) if phone is None or phones.count(phone) == 1
    ]
    renamed = {**users[0], "version": users[0]["version"] + 1, "firstName": "Пётр"}
    deleted = {**users[1], "version": users[1]["version"] + 1, "isDeleted": True}
    return TalentDataset(dataset.tenants, [*users, renamed, deleted])


def _phone(user: dict[str, Any]) -> str | None:
    try:
        return normalize_phone(user["phone"])
    except InvalidPhoneError:
        return None


def _world(world: TalentWorld, mode: ImportMode, database_url: str) -> TalentWorld:
    return TalentWorld(
        mode, world.settings.model_copy(update={"database_url": database_url}), world.api, world.topics
    )


def _picture(container: Container) -> tuple[Any, ...]:
    events = sorted(
        json.dumps(e, sort_keys=True, ensure_ascii=False) for e in talent.outbox_events(container)
    )
    with container.connections.database.connection() as conn:
        quarantine = sorted(
            conn.execute(
                "SELECT stage, external_id::text, error_code FROM identity.talent_import_failed_items"
            ).fetchall()
        )
    return talent.replica_state(container), events, quarantine


def _difference(mine: Any, theirs: Any) -> Any:
    if isinstance(mine, dict):
        return {k: _difference(mine[k], theirs[k]) for k in mine if mine[k] != theirs.get(k)}
    return [row for row in mine if row not in theirs][:3] + [row for row in theirs if row not in mine][:3]


def test_api_pull_topic_replay_and_the_consumer_build_the_same_replica_and_events(
    settings: Any,
    talent_api: SimulatedTalentApi,
    talent_topics: TalentTopics,
    another_database: Callable[[], str],
) -> None:
    base = TalentWorld(ImportMode.API_PULL, settings, talent_api, talent_topics)
    base.publish(_dataset())
    pictures = {}
    for mode in ImportMode:
        world = _world(base, mode, another_database())
        assert world.run(page_size=9).status is RunStatus.COMPLETED
        pictures[mode.value] = _picture(world.container)
        world.close()
    consumer_world = _world(base, ImportMode.TOPIC_REPLAY, another_database())
    # A group of its own: the replay above handed its group over at the topics' end.
    fresh_group = TalentTopics(talent_topics.tenants, talent_topics.users, f"{talent_topics.group}-parity")
    clock = ManualClock()
    talent.run_until_caught_up(talent.sync_job(consumer_world.container, fresh_group, clock=clock))
    # Users read before their tenant wait for their next try (1 s later): one more pass when it is due, as
    # the running consumer makes it.
    clock.advance(60)
    talent.run_until_caught_up(talent.sync_job(consumer_world.container, fresh_group, clock=clock))
    pictures["consumer"] = _picture(consumer_world.container)
    consumer_world.close()
    base.close()

    users = pictures["ApiPull"][0]["users"]
    assert (len(users), [u[3] for u in users].count("Blocked")) == (59, 1)  # the poison users are quarantined
    for other in ("TopicReplay", "consumer"):
        for part, name in enumerate(("replica", "events", "quarantine")):
            mine, theirs = pictures["ApiPull"][part], pictures[other][part]
            assert mine == theirs, (other, name, _difference(mine, theirs))


def test_the_import_racing_the_consumer_ends_as_either_alone(
    world: TalentWorld, another_database: Callable[[], str]
) -> None:
    dataset = _dataset()
    world.publish(dataset)
    alone = _world(world, world.mode, another_database())
    alone.run(page_size=5)
    expected = talent.replica_state(alone.container)
    alone.close()

    consumer = talent.sync_job(world.container, world.topics)
    racing = threading.Thread(target=talent.run_until_caught_up, args=(consumer,))
    racing.start()
    run = run_to_end(world.container, ImportRequest(world.mode, page_size=5))
    racing.join(timeout=120)

    assert not racing.is_alive()
    assert run.status is RunStatus.COMPLETED
    state = talent.replica_state(world.container)
    assert state == expected
    assert all(len(user[-1] or []) <= 1 for user in state["users"])  # never a second default role
