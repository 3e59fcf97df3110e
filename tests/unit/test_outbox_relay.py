"""The relay loop over in-memory fakes: what it settles, when it backs off, when it stands by."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Collection, Mapping, Sequence

from pin_identity.jobs.outbox_relay import OutboxRelay, RelaySettings
from pin_identity.jobs.ports import PendingEvent, PublishReport


def _event(n: int) -> PendingEvent:
    return PendingEvent(n, "t", "k", b"{}", "E", str(uuid.uuid4()), None)


class MemoryQueue:
    def __init__(self, rows: list[PendingEvent], *, active: bool = True):
        self.rows, self.active = rows, active
        self.dead: dict[int, str] = {}
        self.resets = 0

    def try_become_active(self) -> bool:
        return self.active

    def fetch_ready(self, limit: int, exclude: Collection[int]) -> list[PendingEvent]:
        return [row for row in self.rows if row.outbox_id not in exclude][:limit]

    def settle(self, delivered: Sequence[int], rejected: Mapping[int, str]) -> None:
        gone = set(delivered) | set(rejected)
        self.rows = [row for row in self.rows if row.outbox_id not in gone]
        self.dead.update(rejected)

    def backlog(self) -> tuple[int, float]:
        return len(self.rows), 0.0

    def reset(self) -> None:
        self.resets += 1


class ScriptedPublisher:
    """Answers each outbox id from a script: 'ok', 'reject', or 'retry' (then 'ok' next time).

    Answers arrive on the next collect(), like broker acknowledgements.
    """

    def __init__(self, script: dict[int, str]):
        self.script = script
        self.sent: list[list[int]] = []
        self._answers = PublishReport()

    def send(self, events: Sequence[PendingEvent]) -> PublishReport:
        self.sent.append([e.outbox_id for e in events])
        for event in events:
            verdict = self.script.get(event.outbox_id, "ok")
            if verdict == "reject":
                self._answers.rejected[event.outbox_id] = "MSG_SIZE_TOO_LARGE"
            elif verdict == "retry":
                self._answers.retry[event.outbox_id] = "_MSG_TIMED_OUT"
                self.script[event.outbox_id] = "ok"
            else:
                self._answers.delivered.append(event.outbox_id)
        return PublishReport()

    def collect(self, timeout_s: float) -> PublishReport:
        answers, self._answers = self._answers, PublishReport()
        return answers


FAST = RelaySettings(batch_size=3, max_in_flight=6, idle_wait_s=0, standby_wait_s=0, max_backoff_s=0)


def test_once_drains_in_batches_dead_letters_rejects_and_retries_the_rest() -> None:
    queue = MemoryQueue([_event(n) for n in range(1, 8)])
    publisher = ScriptedPublisher({2: "reject", 5: "retry"})
    OutboxRelay(queue, publisher, FAST).run(threading.Event(), once=True)
    assert queue.rows == []
    assert queue.dead == {2: "MSG_SIZE_TOO_LARGE"}
    # 5 asks for a retry: nothing new is sent until the batch in flight settled, then 5 goes first.
    assert publisher.sent == [[1, 2, 3], [4, 5, 6], [5, 7]]
    assert queue.resets == 1  # the session is released when the relay stops


def test_a_standby_relay_publishes_nothing() -> None:
    queue = MemoryQueue([_event(1)], active=False)
    publisher = ScriptedPublisher({})
    OutboxRelay(queue, publisher, FAST).run(threading.Event(), once=True)
    assert publisher.sent == [] and len(queue.rows) == 1


def test_a_failing_queue_is_reset_and_retried_until_stopped() -> None:
    stop = threading.Event()

    class BrokenQueue(MemoryQueue):
        def fetch_ready(self, limit: int, exclude: Collection[int]) -> list[PendingEvent]:
            if self.resets >= 3:
                stop.set()
            raise ConnectionError("database went away")

    queue = BrokenQueue([])
    OutboxRelay(queue, ScriptedPublisher({}), FAST).run(stop)
    assert queue.resets >= 3
