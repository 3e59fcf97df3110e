"""Every Kafka consumer of the project is built in one place, which applies the operator's properties
(PIN_IDENTITY_KAFKA_CONFIG) and then pins `isolation.level=read_committed` over them: the relay writes in
transactions, and a consumer on read_uncommitted (the Java client's default, easily copied) would read an
aborted transaction's events as published. tests/integration/test_read_committed.py shows it on a broker."""

from __future__ import annotations

import ast
from pathlib import Path

import pin_identity
from pin_identity.adapters.kafka import consumers
from pin_identity.adapters.kafka.consumers import consumer_config

SOURCE = Path(pin_identity.__file__).parent
OPERATOR = {"bootstrap.servers": "kafka:9093", "isolation.level": "read_uncommitted", "client.id": "ops"}


def test_read_committed_is_pinned_over_the_operators_properties_and_the_readers_settings() -> None:
    config = consumer_config(OPERATOR, {"group.id": "g", "isolation.level": "read_uncommitted"})
    assert config["isolation.level"] == "read_committed"
    assert (config["client.id"], config["group.id"]) == ("ops", "g")


def test_the_operators_properties_override_a_readers_defaults_but_not_its_settings() -> None:
    config = consumer_config(
        {**OPERATOR, "session.timeout.ms": 30_000, "group.id": "theirs"},
        {"group.id": "ours"},
        defaults={"session.timeout.ms": 10_000, "auto.offset.reset": "earliest"},
    )
    assert (config["session.timeout.ms"], config["auto.offset.reset"]) == (30_000, "earliest")
    assert config["group.id"] == "ours"


def test_a_producers_partitioner_is_left_out_of_a_consumer() -> None:
    assert "partitioner" not in consumer_config({**OPERATOR, "partitioner": "murmur2_random"})


def _constructions(path: Path) -> list[int]:
    """Lines of `path` that call confluent_kafka's Consumer."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Consumer"
    ]


def test_no_consumer_is_built_anywhere_else() -> None:
    home = Path(consumers.__file__)
    elsewhere = {
        f"{path.relative_to(SOURCE)}:{line}"
        for path in SOURCE.rglob("*.py")
        if path != home
        for line in _constructions(path)
    }
    assert not elsewhere, f"Consumer built outside adapters/kafka/consumers.py: {sorted(elsewhere)}"
    assert _constructions(home), "consumers.py builds the consumers"
