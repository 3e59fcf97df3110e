"""Reads back what the relay published: from where the topics stood when the tap was opened, or from their
beginning."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Iterable

from pin_identity.adapters.kafka.reader import ReadEvent, TopicReader
from tests.support.waiting import holds_within

ConsumedEvent = ReadEvent


def assert_versions_never_go_back(read: Iterable[tuple[str, int]]) -> dict[str, list[int]]:
    """Each key's versions in the order read (key, version), asserted never to go back: one aggregate's events
    keep their order on the topic (CONTRACTS section 4), a repeat being at-least-once delivery. Returns them
    by key for the test's own checks."""
    versions: dict[str, list[int]] = defaultdict(list)
    for key, version in read:
        versions[key].append(version)
    went_back = {key: seen for key, seen in versions.items() if seen != sorted(seen)}
    assert went_back == {}, f"{len(went_back)} keys' versions went back, e.g. {min(went_back.items())}"
    return dict(versions)


class EventTap:
    """The product's TopicReader plus waiting helpers; tests filter what they read by the ids they created."""

    def __init__(self, bootstrap_servers: str, topics: Iterable[str], *, from_beginning: bool = False):
        self._reader = TopicReader(
            {"bootstrap.servers": bootstrap_servers}, topics, from_beginning=from_beginning
        )
        self.received: list[ConsumedEvent] = []

    def poll(self, timeout_s: float = 0.2) -> None:
        self.received.extend(self._reader.read(timeout_s))

    def wait_for(
        self, where: Callable[[ConsumedEvent], bool], count: int, timeout_s: float = 30.0
    ) -> list[ConsumedEvent]:
        """Poll until `count` matching events arrived (fails the test on timeout); returns them."""

        def arrived() -> bool:
            if sum(1 for event in self.received if where(event)) >= count:
                return True
            self.poll()
            return False

        holds_within(arrived, timeout_s, every_s=0)
        matching = [event for event in self.received if where(event)]
        assert len(matching) >= count, f"received {len(matching)} of {count} events in {timeout_s}s"
        return matching

    def read_to_end(
        self, where: Callable[[ConsumedEvent], bool], timeout_s: float = 30.0
    ) -> list[ConsumedEvent]:
        """Everything matching, read up to the end offsets the topics have now: once the outbox is drained
        (every event acknowledged), that is everything published."""
        self.received.extend(self._reader.read_to_end(timeout_s))
        return [event for event in self.received if where(event)]

    def settle(self, where: Callable[[ConsumedEvent], bool], quiet_s: float = 1.0) -> list[ConsumedEvent]:
        """Everything matching that arrives until the topics have been quiet for `quiet_s`: for showing that
        nothing (more) arrives while something may still publish, never for "read everything"."""
        deadline = time.monotonic() + quiet_s
        seen = len(self.received)
        while time.monotonic() < deadline:
            self.poll(0.1)
            if len(self.received) != seen:
                seen, deadline = len(self.received), time.monotonic() + quiet_s
        return [event for event in self.received if where(event)]

    def close(self) -> None:
        self._reader.close()
