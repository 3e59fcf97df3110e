"""`pin-identity worker`: the chosen jobs, one thread each, until SIGTERM/SIGINT (or, with --once, idle)."""

from __future__ import annotations

import functools
import signal
import threading
from collections.abc import Callable, Sequence
from typing import Protocol

from pin_identity.composition import Container
from pin_identity.entrypoints.worker_http import serve_worker_http
from pin_identity.jobs.outbox_relay import OutboxRelay
from pin_identity.jobs.ports import StopSignal
from pin_identity.observability.logging import get_logger

log = get_logger("worker")


class Job(Protocol):
    def run(self, stop: StopSignal, *, once: bool = False) -> None: ...


def _outbox_relay(container: Container) -> OutboxRelay:
    container.ensure_topics()
    return container.outbox_relay()


JOB_FACTORIES: dict[str, Callable[[Container], Job]] = {
    "access-fanout": Container.access_fanout,
    "outbox-relay": _outbox_relay,
    "talent-sync": Container.talent_sync,
    "talent-import": Container.talent_import,
}
ALL_JOBS: tuple[str, ...] = tuple(JOB_FACTORIES)


def run_worker(container: Container, jobs: Sequence[str], *, once: bool) -> int:
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    runners = {name: JOB_FACTORIES[name](container) for name in jobs if name != "outbox-relay"}
    crashed: list[str] = []
    writers = [
        _thread(name, functools.partial(job.run, stop, once=once), stop, crashed)
        for name, job in runners.items()
    ]
    threads = list(writers)
    if "outbox-relay" in jobs:
        # With --once the relay publishes what the process's other jobs write: it ends only once they all
        # ended and no committed row is left in the outbox.
        relay = _outbox_relay(container)
        until = functools.partial(_all_ended, writers)
        run = functools.partial(relay.run, stop, once=once, until=until)
        threads.append(_thread("outbox-relay", run, stop, crashed))
    http = None
    if container.settings.worker_http_port:
        http = serve_worker_http(
            container.settings.worker_http_port,
            alive=lambda: all(t.is_alive() for t in threads) or once,
            ready=lambda: container.database.ping() and container.broker_reachable(),
        )
    log.info("worker-started", jobs=list(jobs), once=once)
    for thread in threads:
        thread.start()
    for thread in threads:
        while thread.is_alive():
            thread.join(0.2)
    if http is not None:
        http.shutdown()
    log.info("worker-stopped", graceful=not crashed)
    return 1 if crashed else 0


def _all_ended(threads: Sequence[threading.Thread]) -> bool:
    return not any(thread.is_alive() for thread in threads)


def _thread(
    name: str, run: Callable[[], None], stop: threading.Event, crashed: list[str]
) -> threading.Thread:
    return threading.Thread(target=_guarded, args=(name, run, stop, crashed), name=name, daemon=True)


def _guarded(name: str, run: Callable[[], None], stop: threading.Event, crashed: list[str]) -> None:
    try:
        run()
    except Exception:
        log.exception("worker-job-crashed", job=name)
        crashed.append(name)
        stop.set()  # one dead job stops the process, so the orchestrator restarts it whole
