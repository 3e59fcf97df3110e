"""`pin-identity worker`: the chosen jobs, one thread each, until SIGTERM/SIGINT (or, with --once, idle)."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Sequence
from typing import Protocol

from pin_identity.composition import Container
from pin_identity.entrypoints.worker_http import serve_worker_http
from pin_identity.jobs.ports import StopSignal
from pin_identity.observability.logging import get_logger

log = get_logger("worker")


class Job(Protocol):
    def run(self, stop: StopSignal, *, once: bool = False) -> None: ...


def _outbox_relay(container: Container) -> Job:
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
    runners = {name: JOB_FACTORIES[name](container) for name in jobs}
    crashed: list[str] = []
    threads = [
        threading.Thread(target=_guarded, args=(name, job, stop, once, crashed), name=name, daemon=True)
        for name, job in runners.items()
    ]
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


def _guarded(name: str, job: Job, stop: threading.Event, once: bool, crashed: list[str]) -> None:
    try:
        job.run(stop, once=once)
    except Exception:
        log.exception("worker-job-crashed", job=name)
        crashed.append(name)
        stop.set()  # one dead job stops the process, so the orchestrator restarts it whole
