"""`pin-identity worker`: the chosen jobs, one thread each, until SIGTERM/SIGINT (or, with --once, idle)."""

from __future__ import annotations

import functools
import signal
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer

from pin_identity.composition import Container
from pin_identity.entrypoints.probes import ReadinessCheck
from pin_identity.entrypoints.worker_http import bind_worker_http, start_serving
from pin_identity.jobs.outbox_relay import OutboxRelay
from pin_identity.jobs.outbox_relay_observer import RelayObserver
from pin_identity.jobs.talent_sync_observer import TalentSyncObserver
from pin_identity.observability.logging import get_logger
from pin_identity.operations.ports.worker import Job

log = get_logger("worker")


@dataclass(frozen=True)
class JobObservers:
    """The observers of the jobs whose warnings `/readyz` carries: the relay's (a topic missing, too few
    replicas in sync, a broker that acknowledges nothing) and talent-sync's (offsets it cannot commit)."""

    relay: RelayObserver = field(default_factory=RelayObserver)
    talent_sync: TalentSyncObserver = field(default_factory=TalentSyncObserver)

    def readiness_warning(self) -> str | None:
        warnings = [self.relay.readiness_warning(), self.talent_sync.readiness_warning()]
        return "; ".join(warning for warning in warnings if warning) or None


def _outbox_relay(container: Container, observers: JobObservers) -> OutboxRelay:
    if container.settings.outbox_relay_creates_topics:
        container.connections.ensure_topics()
    return container.jobs.outbox_relay(observer=observers.relay)


JOB_FACTORIES: dict[str, Callable[[Container, JobObservers], Job]] = {
    "access-fanout": lambda container, _: container.jobs.access_fanout(),
    "outbox-relay": _outbox_relay,
    "talent-sync": lambda container, observers: container.jobs.talent_sync(observer=observers.talent_sync),
    "talent-import": lambda container, _: container.jobs.talent_import(),
}
ALL_JOBS: tuple[str, ...] = tuple(JOB_FACTORIES)
# The jobs that cannot start without the broker (talent-import needs it only to orchestrate a TopicReplay
# run, and says so then).
BROKER_JOBS = frozenset({"outbox-relay", "talent-sync"})


def run_worker(container: Container, jobs: Sequence[str], *, once: bool) -> int:
    # What the operator must fix (the broker, a taken port) fails here, as one line naming its variable,
    # before any job exists; so does the database, or a role without a grant one of the jobs uses.
    if BROKER_JOBS.intersection(jobs):
        container.connections.require_broker()
    container.connections.check_database_grants(jobs)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    crashed: list[str] = []
    threads: list[threading.Thread] = []
    observers = JobObservers()
    http = _bind_http(container, threads, once=once, warning=observers.readiness_warning)
    try:
        threads.extend(_job_threads(container, jobs, stop, crashed, once=once, observers=observers))
    except BaseException:
        if http is not None:
            http.server_close()
        raise
    log.info("worker-started", jobs=list(jobs), once=once)
    for thread in threads:
        thread.start()
    if http is not None:  # after the jobs started: /healthz must not answer for threads not yet running
        start_serving(http)
    for thread in threads:
        while thread.is_alive():
            thread.join(0.2)
    if http is not None:
        http.shutdown()
        http.server_close()
    log.info("worker-stopped", graceful=not crashed)
    return 1 if crashed else 0


def _job_threads(
    container: Container,
    jobs: Sequence[str],
    stop: threading.Event,
    crashed: list[str],
    *,
    once: bool,
    observers: JobObservers,
) -> list[threading.Thread]:
    runners = {name: JOB_FACTORIES[name](container, observers) for name in jobs if name != "outbox-relay"}
    writers = [
        _thread(name, functools.partial(job.run, stop, once=once), stop, crashed)
        for name, job in runners.items()
    ]
    if "outbox-relay" not in jobs:
        return writers
    # With --once the relay publishes what the process's other jobs write: it ends only once they all
    # ended and no committed row is left in the outbox.
    relay = _outbox_relay(container, observers)
    run = functools.partial(relay.run, stop, once=once, until=functools.partial(_all_ended, writers))
    return [*writers, _thread("outbox-relay", run, stop, crashed)]


def _bind_http(
    container: Container,
    threads: Sequence[threading.Thread],
    *,
    once: bool,
    warning: Callable[[], str | None],
) -> ThreadingHTTPServer | None:
    if not container.settings.worker_http_port:
        return None
    return bind_worker_http(
        container.settings.worker_http_port,
        alive=lambda: once or (all(t.is_alive() for t in threads) and not container.jobs.relay_stalled()),
        readiness=ReadinessCheck.of(container, warning=warning),
    )


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
