"""`pin-identity worker`: the chosen jobs, one thread each, until SIGTERM/SIGINT (or, with --once, idle)."""

from __future__ import annotations

import functools
import signal
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer

from pin_identity.composition import Container
from pin_identity.entrypoints.readiness import ReadinessCheck
from pin_identity.entrypoints.worker_http import bind_worker_http, start_serving
from pin_identity.jobs.outbox_relay_observer import RelayObserver
from pin_identity.jobs.talent_sync_observer import TalentSyncObserver
from pin_identity.observability.logging import get_logger
from pin_identity.operations.ports.job_control import Job, StopSignal

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


# A job's loop as the worker runs it: until `stop` (or, with `once`, until it is idle and `followed_ended()`:
# the jobs it follows have all ended).
JobRun = Callable[[StopSignal, bool, Callable[[], bool]], None]
BuildJob = Callable[[Container, JobObservers], JobRun]


@dataclass(frozen=True)
class WorkerJob:
    """What sets one job apart in the worker."""

    build: BuildJob
    needs_broker: bool = False  # cannot start without it
    # It publishes what the process's other jobs write: it starts after them and, with --once, ends only once
    # they all ended and it has nothing left.
    follows_the_others: bool = False


def _on_its_own(make: Callable[[Container, JobObservers], Job]) -> BuildJob:
    """A job that follows no other: it runs as its Job does."""

    def build(container: Container, observers: JobObservers) -> JobRun:
        job = make(container, observers)
        return lambda stop, once, _followed_ended: job.run(stop, once=once)

    return build


def _outbox_relay(container: Container, observers: JobObservers) -> JobRun:
    if container.settings.outbox_relay_creates_topics:
        container.connections.ensure_topics()
    relay = container.jobs.outbox_relay(observer=observers.relay)
    return lambda stop, once, followed_ended: relay.run(stop, once=once, until=followed_ended)


JOBS: dict[str, WorkerJob] = {
    "access-fanout": WorkerJob(_on_its_own(lambda container, _: container.jobs.access_fanout())),
    "outbox-relay": WorkerJob(_outbox_relay, needs_broker=True, follows_the_others=True),
    "talent-sync": WorkerJob(
        _on_its_own(lambda container, observers: container.jobs.talent_sync(observer=observers.talent_sync)),
        needs_broker=True,
    ),
    # It needs the broker only to orchestrate a TopicReplay run, and says so then.
    "talent-import": WorkerJob(_on_its_own(lambda container, _: container.jobs.talent_import())),
}
ALL_JOBS: tuple[str, ...] = tuple(JOBS)


def run_worker(container: Container, jobs: Sequence[str], *, once: bool) -> int:
    # What the operator must fix (the broker, a taken port) fails here, as one line naming its variable,
    # before any job exists; so does the database, or a role without a grant one of the jobs uses.
    if any(JOBS[name].needs_broker for name in jobs):
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
    chosen = list(dict.fromkeys(jobs))  # a job named twice runs once

    def threads_of(names: list[str], followed: list[threading.Thread]) -> list[threading.Thread]:
        runs = {name: JOBS[name].build(container, observers) for name in names}
        followed_ended = functools.partial(_all_ended, followed)
        return [
            _thread(name, functools.partial(run, stop, once, followed_ended), stop, crashed)
            for name, run in runs.items()
        ]

    writers = threads_of([name for name in chosen if not JOBS[name].follows_the_others], [])
    return [*writers, *threads_of([name for name in chosen if JOBS[name].follows_the_others], writers)]


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
