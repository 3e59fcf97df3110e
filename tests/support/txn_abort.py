"""librdkafka 2.16's abort on an invalid transaction state transition, reproduced in a process of its own (the
SIGABRT ends only that process): `python -m tests.support.txn_abort MODE BOOTSTRAP TOPIC BROKER_PID`.

The broker is stopped (SIGSTOP) while a commit is under way, so that its EndTxn waits in the socket, and
continued (SIGCONT) between two calls of the producer's. MODE says how the producer is driven meanwhile:

- `stepped`: commit_transaction() with a timeout that runs out (the EndTxn is sent: resumable), then again
  with one too short for its first phase, then nothing: librdkafka forgets that a commit is under way, takes
  the EndTxn's answer for an abort's, and aborts the process (CommittingTransaction -> AbortedNotAcked).
- `resumed`: the control: the second call has the relay's 5 s, and librdkafka's main thread stalls for 2 s of
  it: the first phase is served late but in time, and the commit completes.
- `publisher`: the relay's own publisher (KafkaEventPublisher), driven by collect() as the relay does, the
  broker stopped while it commits and continued between two collect() calls, the main thread stalled for 2 s
  of the second; prints `delivered N`.

During the call that is to miss its first phase, librdkafka's main thread is starved (_main_thread_starved),
as on a loaded machine; without that the call is usually served in time and the abort is a race.

In `stepped` and `resumed` librdkafka logs to stderr (debug eos,protocol,broker; no logger callback, whose
queue the abort would lose). The publisher keeps its own logger: an abort leaves glibc's assertion message.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from confluent_kafka import KafkaException, Producer

from pin_identity.adapters.kafka.publisher import KafkaEventPublisher
from pin_identity.operations.ports.outbox import PendingEvent
from tests.support.clocks import ManualClock
from tests.support.waiting import wait_until

DEBUG = "eos,protocol,broker"
_RELAY_COMMIT_TIMEOUT_S = 5.0
# How long the main thread is starved in the calls the relay's timeout is to see through: well below it.
_STALL_S = 2.0
# Busy processes beside the starved thread: the more, the longer it waits for its turn.
_BUSY = 4
_IDS = range(1, 101)
# After SIGCONT: long enough for the broker to answer the EndTxn that waited in its socket (about 0.5 s here;
# a process that aborts does so the moment the answer comes, so this costs only the cases that do not).
_ANSWER_S = 5.0


def _stepped(bootstrap: str, topic: str, broker_pid: int, second_timeout_s: float) -> None:
    producer = Producer(
        {"bootstrap.servers": bootstrap, "transactional.id": "txn-abort-repro", "debug": DEBUG}
    )
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topic, b"v", b"k")
    assert producer.flush(30) == 0  # the partition is in the transaction, the event written
    os.kill(broker_pid, signal.SIGSTOP)
    try:
        _commit_expecting_timeout(producer, 1.0)  # the EndTxn is sent, and waits in the socket
        # As on a loaded machine: the first phase is not served in time (by a call of no time at all), or is
        # served late (a stall shorter than the relay's call).
        with _main_thread_starved(None if second_timeout_s == 0 else _STALL_S):
            _commit_expecting_timeout(producer, second_timeout_s)
        time.sleep(0.5)  # the first phase is served now, its result thrown away
    finally:
        os.kill(broker_pid, signal.SIGCONT)
    time.sleep(_ANSWER_S)  # `stepped` aborts here, when the EndTxn's answer comes
    producer.commit_transaction(30)
    print("committed", flush=True)


@contextmanager
def _main_thread_starved(for_s: float | None = None) -> Iterator[None]:
    """librdkafka's main thread (`rdk:main`) at idle priority on a CPU that busy processes hold (not threads
    of this process: those would wait for Python's lock): it serves nothing while the block runs, or for
    `for_s` at most. How long an idle thread waits beside busy ones depends on everything else the machine
    runs: a call that is to be served in time is starved for a bounded time, not for as long as it lasts."""
    cpus = sorted(os.sched_getaffinity(0))
    tasks = Path("/proc/self/task")
    (main,) = [int(t.name) for t in tasks.iterdir() if (t / "comm").read_text().strip() == "rdk:main"]
    caller = threading.get_native_id()
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(_BUSY)]
    for process in busy:
        os.sched_setaffinity(process.pid, {cpus[0]})
    os.sched_setaffinity(main, {cpus[0]})
    os.sched_setscheduler(main, os.SCHED_IDLE, os.sched_param(0))
    os.sched_setaffinity(caller, set(cpus[1:]) or set(cpus))  # the calling thread runs beside them
    time.sleep(0.2)
    ended = threading.Lock()

    def end() -> None:
        if not ended.acquire(blocking=False):
            return  # ended already (by the timer, or by the block's end)
        for process in busy:
            process.kill()
            process.wait()
        with contextlib.suppress(PermissionError):  # without CAP_SYS_NICE it stays idle: it has CPUs now
            os.sched_setscheduler(main, os.SCHED_OTHER, os.sched_param(0))
        os.sched_setaffinity(main, set(cpus))
        os.sched_setaffinity(caller, set(cpus))

    timer = threading.Timer(for_s, end) if for_s is not None else None
    if timer is not None:
        timer.start()
    try:
        yield
    finally:
        if timer is not None:
            timer.cancel()
        end()


def _commit_expecting_timeout(producer: Producer, timeout_s: float) -> None:
    try:
        producer.commit_transaction(timeout_s)
    except KafkaException as exc:
        error = exc.args[0]
        print(f"commit_transaction({timeout_s}): {error.name()} retriable={error.retriable()}", flush=True)
        assert error.retriable(), error
        return
    raise AssertionError("the commit completed while the broker was stopped")


def _publisher(bootstrap: str, topic: str, broker_pid: int) -> None:
    publisher = KafkaEventPublisher(
        {"bootstrap.servers": bootstrap, "debug": DEBUG},
        None,
        transactional_id="txn-abort-repro",
        clock=ManualClock(),  # a transaction never grows old: it is committed when collect() is given a wait
    )
    publisher.start()
    publisher.send([PendingEvent(n, topic, f"user-{n}", b"{}", "UserAccessChanged", "c", None) for n in _IDS])
    delivered: set[int] = set()
    # Answered, not yet committed (a collect() without a wait is no commit yet: the transaction is young).
    wait_until(
        lambda: not publisher.collect(0).delivered and not len(publisher._producer),  # type: ignore[arg-type]
        "every event is answered",
        timeout_s=60,
        every_s=0,
    )
    os.kill(broker_pid, signal.SIGSTOP)
    try:
        delivered.update(publisher.collect(0.05).delivered)  # as the relay waiting for answers: commits
        with _main_thread_starved(_STALL_S):
            delivered.update(publisher.collect(0).delivered)  # as the relay's next step
    finally:
        os.kill(broker_pid, signal.SIGCONT)
    time.sleep(_ANSWER_S)  # the EndTxn's answer comes between two collect() calls
    wait_until(
        lambda: bool(delivered.update(publisher.collect(0.05).delivered)) or delivered == set(_IDS),
        "every event is delivered",
        timeout_s=60,
        every_s=0,
    )
    print(f"delivered {len(delivered)}", flush=True)
    publisher.discard()


def main(argv: list[str]) -> None:
    mode, bootstrap, topic, broker_pid = argv[0], argv[1], argv[2], int(argv[3])
    if mode == "publisher":
        _publisher(bootstrap, topic, broker_pid)
    else:
        _stepped(bootstrap, topic, broker_pid, 0 if mode == "stepped" else _RELAY_COMMIT_TIMEOUT_S)


if __name__ == "__main__":
    main(sys.argv[1:])
