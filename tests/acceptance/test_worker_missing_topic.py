"""A relay that may not create topics (PIN_IDENTITY_OUTBOX_RELAY_CREATES_TOPICS=false: a separate admin job
creates them) meets the access topic deleted under it: the worker holds the topic's events, says so in one
log line, on /readyz and in a gauge, and publishes every one once an operator runs `kafka ensure-topics`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from pin_identity.composition import Container
from pin_identity.config import Settings
from pin_identity.domain.events import ACCESS_TOPIC
from tests.support import seed
from tests.support.brokers import delete_topic
from tests.support.cli import run_cli
from tests.support.relay import (
    change_permissions_inline,
    outbox_count,
    readiness_warnings,
    relay_worker,
    users_told_of_the_change,
)
from tests.support.waiting import wait_until

HOLDERS = 20
# The events in flight to the deleted topic are given up on after 3 s (production: a minute).
SHORT_TIMEOUTS = '{"message.timeout.ms": "3000", "topic.metadata.propagation.max.ms": "1000"}'
MISSING_GAUGE = f'identity_outbox_topic_missing{{topic="{ACCESS_TOPIC}"}}'


@pytest.fixture
def env(subprocess_env: dict[str, str], own_broker: str) -> dict[str, str]:
    return {
        **subprocess_env,
        "PIN_IDENTITY_KAFKA_BOOTSTRAP_SERVERS": own_broker,
        "PIN_IDENTITY_KAFKA_CONFIG": SHORT_TIMEOUTS,
        "PIN_IDENTITY_OUTBOX_RELAY_CREATES_TOPICS": "false",
    }


def _gauge(base: str) -> str | None:
    for line in httpx.get(f"{base}/metrics", timeout=5).text.splitlines():
        if line.startswith(MISSING_GAUGE):
            return line.split()[-1]
    return None


def _log_lines(log: Path, event: str) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    return [line for line in lines if line.get("event") == event]


def test_a_relay_that_may_not_create_topics_holds_says_so_and_goes_on_after_kafka_ensure_topics(
    env: dict[str, str], settings: Settings, own_broker: str, database_url: str, tmp_path: Path
) -> None:
    assert run_cli(env, "kafka", "ensure-topics").returncode == 0  # the admin job, before the relay starts
    container = Container(settings.model_copy(update={"kafka_bootstrap_servers": own_broker}))
    _, role = seed.held_role(container.stores.identity_transactions, HOLDERS)
    with relay_worker(env, tmp_path) as (base, _, log):
        wait_until(lambda: outbox_count(database_url) == 0, "the grants are published")
        delete_topic(own_broker, ACCESS_TOPIC)
        change_permissions_inline(container, role, HOLDERS)
        wait_until(lambda: readiness_warnings(base) != [], "/readyz warns of the held topic")
        assert readiness_warnings(base) == [
            f"the outbox relay holds the events of {ACCESS_TOPIC}: the broker does not have the topic"
            " (the relay does not create topics)"
        ]
        assert _gauge(base) == "1.0"
        assert outbox_count(database_url) == HOLDERS
        assert outbox_count(database_url, "outbox_dead_letters") == 0

        created = run_cli(env, "kafka", "ensure-topics")  # the operator
        assert created.returncode == 0, created.stderr
        wait_until(lambda: outbox_count(database_url) == 0, "the held events are published")
        # the relay clears its warnings just after it deletes what the broker acknowledged
        wait_until(lambda: readiness_warnings(base) == [], "/readyz warns of nothing", timeout_s=2)
        assert _gauge(base) == "0.0"
    container.close()
    assert outbox_count(database_url, "outbox_dead_letters") == 0
    assert len(users_told_of_the_change(own_broker, role)) == HOLDERS
    [missing] = _log_lines(log, "outbox-topic-missing")  # one line, however long it holds
    assert (missing["topic"], missing["reason"]) == (ACCESS_TOPIC, "the relay does not create topics")
    assert [line["topic"] for line in _log_lines(log, "outbox-topic-found")] == [ACCESS_TOPIC]
    assert _log_lines(log, "outbox-topic-recreated") == []
