"""The settings of the topics the project creates: compacted, and with three replicas or more, two of them in
sync to acknowledge a write; with fewer, the broker's own min.insync.replicas holds."""

from __future__ import annotations

import pytest

from pin_identity.adapters.kafka.topics import TopicLayout


@pytest.mark.parametrize(("replicas", "min_insync"), [(1, None), (2, None), (3, "2"), (5, "2")])
def test_min_insync_replicas_is_two_from_three_replicas_on(replicas: int, min_insync: str | None) -> None:
    config = TopicLayout(12, replicas).config
    assert config["cleanup.policy"] == "compact"
    assert config.get("min.insync.replicas") == min_insync
