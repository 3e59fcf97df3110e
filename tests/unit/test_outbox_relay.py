"""The relay loop over in-memory fakes: what it settles, when it backs off, when it stands by."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Mapping, Sequence

import pytest

from pin_identity.adapters.postgres.outbox_queue import IdHorizon
from pin_identity.domain.errors import OutboxIdsWentBackError
from pin_identity.jobs.outbox_relay import OutboxRelay, RelaySettings
from pin_identity.jobs.outbox_relay_observer import RelayObserver
from pin_identity.operations.ports.outbox import OutboxBacklog, PendingEvent, PublishReport, RelayRole


def _event(n: int, key: str | None = None) -> PendingEvent:
    return PendingEvent(n, "t", key or f"k{n}", b"{}", "E", str(uuid.uuid4()), None)


class MemoryQueue:
    def __init__(self, rows: list[PendingEvent], *, active: bool = True, clean: bool = True):
        self.rows, self.active, self.clean = rows, active, clean
        self.dead: dict[int, str] = {}
        self.stood_down = 0
        self.took_over = False

    def try_become_active(self) -> RelayRole:
        if not self.active:
            return RelayRole.STANDBY
        if not self.took_over:
            self.took_over = True
            return RelayRole.ACTIVE if self.clean else RelayRole.TAKEN_OVER
        return RelayRole.ACTIVE

    def fetch_ready(self, limit: int, after: int) -> list[PendingEvent]:
        return [row for row in self.rows if row.outbox_id > after][:limit]

    def settle(self, delivered: Sequence[int], rejected: Mapping[int, str]) -> None:
        gone = set(delivered) | set(rejected)
        self.rows = [row for row in self.rows if row.outbox_id not in gone]
        self.dead.update(rejected)

    def backlog(self) -> OutboxBacklog:
        return OutboxBacklog(len(self.rows), 0.0)

    def is_drained(self) -> bool:
        return not self.rows

    def heartbeat(self) -> None:
        return None

    def stand_down(self) -> None:
        self.stood_down += 1
        self.took_over = False


class ScriptedPublisher:
    """Answers each outbox id from a script: 'ok', 'reject', or 'retry' (then 'ok' next time).

    Answers arrive on the next collect(), like broker acknowledgements.
    """

    def __init__(self, script: dict[int, str]):
        self.script = script
        self.sent: list[list[int]] = []
        self.discarded = 0
        self.calls: list[str] = []  # "start" and "send", in order
        self._answers = PublishReport()

    def start(self) -> None:
        self.calls.append("start")

    def send(self, events: Sequence[PendingEvent]) -> PublishReport:
        self.sent.append([e.outbox_id for e in events])
        self.calls.append("send")
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

    def discard(self) -> None:
        self.discarded += 1
        self._answers = PublishReport()


class CountingStop:
    """A stop signal that records every wait and sets itself after `limit` of them."""

    def __init__(self, limit: int = 1000):
        self.waits: list[float | None] = []
        self._limit = limit

    def is_set(self) -> bool:
        return len(self.waits) >= self._limit

    def wait(self, timeout: float | None = None) -> bool:
        self.waits.append(timeout)
        return self.is_set()


FAST = RelaySettings(batch_size=3, max_in_flight=6, idle_wait_s=0, standby_wait_s=0, max_backoff_s=0)


def test_once_drains_in_batches_dead_letters_rejects_and_retries_the_rest() -> None:
    queue = MemoryQueue([_event(n) for n in range(1, 8)])
    publisher = ScriptedPublisher({2: "reject", 5: "retry"})
    OutboxRelay(queue, publisher, FAST).run(threading.Event(), once=True)
    assert queue.rows == []
    assert queue.dead == {2: "MSG_SIZE_TOO_LARGE"}
    # 5 asks for a retry: nothing new is sent until the batch in flight settled, then 5 goes first.
    assert publisher.sent == [[1, 2, 3], [4, 5, 6], [5, 7]]
    assert queue.stood_down == 1 and publisher.discarded == 1  # the lock is handed over when it stops


def test_one_event_per_key_is_in_flight_so_a_retried_event_goes_before_anything_newer_of_its_key() -> None:
    rows = [_event(1, "a"), _event(2, "a"), _event(3, "b"), _event(4, "a"), _event(5, "b")]
    queue = MemoryQueue(rows)
    publisher = ScriptedPublisher({1: "retry"})
    OutboxRelay(queue, publisher, FAST).run(threading.Event(), once=True)
    assert queue.rows == []
    # 2 and 4 wait behind 1 (same key); when 1 fails it is sent again first, and only then 2, then 4.
    assert publisher.sent == [[1, 3], [1], [2, 5], [4]]


def test_a_standby_relay_publishes_nothing_and_with_once_waits_for_the_outbox_to_drain() -> None:
    queue = MemoryQueue([_event(1)], active=False)
    publisher = ScriptedPublisher({})
    stop = CountingStop(limit=5)
    OutboxRelay(queue, publisher, FAST).run(stop, once=True)
    assert publisher.sent == [] and publisher.calls == [] and len(queue.rows) == 1  # no producer either
    assert len(stop.waits) == 5  # it stood by until stopped: another relay still had rows to publish


def test_with_once_the_relay_waits_until_the_other_jobs_of_its_process_ended() -> None:
    queue = MemoryQueue([])
    ended = iter([False, False, True])
    stop = CountingStop()
    OutboxRelay(queue, ScriptedPublisher({}), FAST).run(stop, once=True, until=lambda: next(ended))
    assert queue.is_drained()  # and it returned after the third look, with nothing sent


def test_an_active_relay_starts_its_producer_before_its_first_read() -> None:
    reads: list[int] = []

    class RecordingQueue(MemoryQueue):
        def fetch_ready(self, limit: int, after: int) -> list[PendingEvent]:
            reads.append(len(publisher.calls))  # how many publisher calls came before this read
            return super().fetch_ready(limit, after)

    publisher = ScriptedPublisher({})
    OutboxRelay(RecordingQueue([_event(1)]), publisher, FAST).run(threading.Event(), once=True)
    assert publisher.calls[:2] == ["start", "send"] and reads[0] == 1


def test_a_relay_taking_over_from_one_that_did_not_stand_down_says_so_and_publishes_at_once() -> None:
    queue = MemoryQueue([_event(1)], clean=False)
    publisher = ScriptedPublisher({})
    observer = RecordingObserver()
    OutboxRelay(queue, publisher, FAST, observer).run(CountingStop(), once=True)
    assert (
        "took over" in observer.calls and publisher.calls[:2] == ["start", "send"] and publisher.sent == [[1]]
    )


def test_a_failing_queue_stands_down_discards_the_producer_and_retries_until_stopped() -> None:
    stop = threading.Event()

    class BrokenQueue(MemoryQueue):
        def heartbeat(self) -> None:
            if self.stood_down >= 3:
                stop.set()
            raise ConnectionError("database went away")

    queue = BrokenQueue([])
    publisher = ScriptedPublisher({})
    OutboxRelay(queue, publisher, FAST).run(stop)
    # Four failures (the fourth stops the relay), each followed by a stand-down, and the final one.
    assert queue.stood_down == 5 and publisher.discarded == 5


def test_the_id_horizon_moves_only_past_ids_whose_writers_have_all_ended() -> None:
    horizon = IdHorizon()
    horizon.observe(10, [])
    assert horizon.final == 0  # one reading says nothing yet: an id taken before it may still commit
    horizon.observe(12, ["3/7"])  # 3/7 may hold an id up to 10 (read before it was seen)
    horizon.observe(15, ["3/7", "4/2"])
    assert horizon.final == 0
    horizon.observe(15, ["4/2"])  # 3/7 ended; 4/2 came after the reading of 10
    assert horizon.final == 10
    horizon.observe(16, ["4/2", "5/1"])  # waits for 4/2, which may hold an id up to 15
    assert horizon.final == 10
    horizon.observe(16, [])
    assert horizon.final == 16  # nobody writing: everything read one observation ago is final


def test_the_id_horizon_never_moves_back_and_says_when_the_sequence_did() -> None:
    horizon = IdHorizon()
    for last_value in (5, 9, 9):
        horizon.observe(last_value, [])
    with pytest.raises(OutboxIdsWentBackError) as went_back:
        horizon.observe(7, [])  # a sequence set back by hand: rows from now on lie below what was read
    assert (went_back.value.read_up_to, went_back.value.now_at) == (9, 7)
    assert horizon.final == 9


def test_the_id_horizon_stands_still_while_a_prepared_transaction_exists() -> None:
    horizon = IdHorizon()
    horizon.observe(10, [])
    horizon.observe(11, ["3/7"])
    horizon.observe(12, ["-1/900"], prepared=True)  # 3/7 prepared: its locks now go by another name
    assert horizon.final == 0
    horizon.observe(12, [])  # committed or rolled back: its rows are visible, or gone
    assert horizon.final == 11  # the last value read before this reading


class RecordingObserver(RelayObserver):
    """The hooks the relay called, in order: what operators see, and what tests can wait on."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def started(self) -> None:
        self.calls.append("started")

    def stopped(self) -> None:
        self.calls.append("stopped")

    def took_over(self) -> None:
        self.calls.append("took over")

    def backlog(self, backlog: OutboxBacklog) -> None:
        self.calls.append(f"backlog {backlog.waiting}")

    def dead_lettered(self, rejected: Mapping[int, str]) -> None:
        self.calls.append(f"dead-lettered {sorted(rejected)}")

    def delivery_failed(self, retry: Mapping[int, str]) -> None:
        self.calls.append(f"not delivered {sorted(retry)}")

    def failed(self, exc: Exception) -> None:
        self.calls.append(f"failed: {exc}")

    def retrying(self, reason: str, attempt: int, delay_s: float) -> None:
        self.calls.append(f"retrying {attempt}: {reason}")


def test_the_observer_hears_the_backlog_a_dead_letter_a_retry_and_the_end() -> None:
    queue = MemoryQueue([_event(n) for n in range(1, 8)])
    observer = RecordingObserver()

    OutboxRelay(queue, ScriptedPublisher({2: "reject", 5: "retry"}), FAST, observer).run(
        threading.Event(), once=True
    )

    assert observer.calls == [
        "started",
        "backlog 7",
        "dead-lettered [2]",
        "not delivered [5]",
        "retrying 1: _MSG_TIMED_OUT",
        "stopped",
    ]


def test_the_observer_hears_each_failure_and_back_off_until_stopped() -> None:
    stop = threading.Event()

    class BrokenQueue(MemoryQueue):
        def heartbeat(self) -> None:
            if self.stood_down >= 2:
                stop.set()
            raise ConnectionError("database went away")

    observer = RecordingObserver()

    OutboxRelay(BrokenQueue([]), ScriptedPublisher({}), FAST, observer).run(stop)

    failure = ["failed: database went away", "retrying {}: ConnectionError"]
    assert observer.calls == [
        "started",
        *(call.format(attempt) for attempt in (1, 2, 3) for call in failure),
        "stopped",
    ]


def test_the_observer_hears_a_takeover_before_anything_is_sent() -> None:
    queue = MemoryQueue([_event(1)], clean=False)
    observer = RecordingObserver()

    OutboxRelay(queue, ScriptedPublisher({}), FAST, observer).run(CountingStop(), once=True)

    assert observer.calls == ["started", "took over", "backlog 1", "stopped"]
