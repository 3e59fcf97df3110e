"""Every Kafka consumer of the project is built here: a reader's defaults, then the operator's properties
(PIN_IDENTITY_KAFKA_CONFIG), then the reader's own settings, then what nobody may change.

`isolation.level=read_committed` is pinned last. The relay writes in transactions and sends an aborted one's
events again; a consumer on read_uncommitted (the Java client's default, easily copied into the variable)
would read the aborted copies as published: `access show`, the audit, TopicReplay, talent-sync and the demo's
checks would then judge by events that never were. librdkafka's default is read_committed, so only a
property the operator set is overridden.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from confluent_kafka import Consumer

from pin_identity.adapters.kafka.client_log import with_client_log

PINNED: Mapping[str, str] = {"isolation.level": "read_committed"}

# Properties only a producer reads (the relay's partitioner, which `access show` also follows): a consumer
# would warn about them at every start.
_PRODUCER_ONLY = frozenset({"partitioner"})


def consumer_config(
    client_config: Mapping[str, Any],
    settings: Mapping[str, Any] | None = None,
    *,
    defaults: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """`defaults` give way to the operator's properties, which give way to the reader's `settings`; the
    shared logger unless one is named (client_log.py)."""
    operator = {key: value for key, value in client_config.items() if key not in _PRODUCER_ONLY}
    return with_client_log({**(defaults or {}), **operator, **(settings or {}), **PINNED})


def new_consumer(
    client_config: Mapping[str, Any],
    settings: Mapping[str, Any] | None = None,
    *,
    defaults: Mapping[str, Any] | None = None,
) -> Consumer:
    return Consumer(consumer_config(client_config, settings, defaults=defaults))
