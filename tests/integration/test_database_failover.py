"""PostgreSQL fails over under the running jobs: a primary with a synchronous standby behind one endpoint, the
primary SIGKILLed (every process of it: a lost node), the standby promoted, the endpoint moved to it and its
wait for a standby cleared, as an HA manager does. No process of ours is restarted: each reconnects by itself
(the pool, the claim holder's session, the relay's session, the fan-out's LISTEN connection, talent-sync's
consumer), the work in progress goes on, and nothing acknowledged is lost."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from uuid import UUID

import psycopg
import pytest

from pin_identity.adapters.kafka.topics import TopicLayout, ensure_topics
from pin_identity.composition import Container
from pin_identity.config import Settings
from pin_identity.domain.events import ACCESS_TOPIC, PUBLISHED_TOPICS
from pin_identity.domain.fanout_policy import FanOutPolicy
from pin_identity.simulation.simulated_talent import (
    SimulatedTalentApi,
    TalentDataset,
    create_talent_topics,
    generate_dataset,
    produce_to_topics,
)
from tests.support import seed, talent
from tests.support.cli import CLI, launch_worker, run_cli
from tests.support.fanout import task_progress
from tests.support.kafka_tap import ConsumedEvent, EventTap, assert_versions_never_go_back
from tests.support.relay import outbox_count
from tests.support.replicated_postgres import ReplicatedPostgres, replicated_postgres
from tests.support.talent import TalentTopics
from tests.support.waiting import wait_until

USERS = 100_000
TENANTS, MANAGERS = 5_000, 50_000
QUEUED = FanOutPolicy(inline_threshold=0)
# Each of our sessions names itself (application_name): those the new primary must see once the jobs have
# reconnected (the pools, the relay's session, the fan-out's LISTEN, the claim holder's, named by its pid).
_HOLDER = "pin-identity holder"  # then its host and pid (holder_session.holder_session_name)
SESSIONS = {"pin-identity", "pin-identity-outbox-relay", "pin-identity-fanout-listen", _HOLDER}


@pytest.fixture
def replicated(postgres_admin_url: str) -> Iterator[ReplicatedPostgres]:
    """A synchronous pair (the session's server made the OS user the servers run as)."""
    with replicated_postgres(synchronous=True) as started:
        yield started


@pytest.fixture
def kafka(own_broker: str) -> str:
    """A broker of the test's own (the access audit reads its whole topic), with the topics we publish to."""
    ensure_topics({"bootstrap.servers": own_broker}, PUBLISHED_TOPICS, TopicLayout(3, 1))
    return own_broker


def _on(subprocess_env: dict[str, str], database_url: str, bootstrap: str) -> dict[str, str]:
    """A process's environment on the replicated database and the test's broker."""
    return {
        **subprocess_env,
        "PIN_IDENTITY_DATABASE_URL": database_url,
        "PIN_IDENTITY_KAFKA_BOOTSTRAP_SERVERS": bootstrap,
    }


class Arrivals:
    """Every access event as it arrives, with when (a reader of its own on a thread)."""

    def __init__(self, bootstrap: str):
        self._tap = EventTap(bootstrap, [ACCESS_TOPIC])
        self._lock = threading.Lock()
        self._seen: list[tuple[float, ConsumedEvent]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while not self._stop.is_set():
            self._tap.poll(0.1)
            with self._lock:
                self._seen.extend((time.monotonic(), event) for event in self._tap.received)
            self._tap.received.clear()

    def of_role(self, role_id: UUID) -> list[tuple[float, ConsumedEvent]]:
        with self._lock:
            return [seen for seen in self._seen if seen[1].payload["changedRoleId"] == str(role_id)]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self._tap.close()


@contextmanager
def _worker(env: dict[str, str], jobs: str, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """The worker process, stopped with SIGTERM (and exit 0) at the end."""
    worker = launch_worker(env, jobs, log)
    try:
        yield worker.process
    finally:
        assert worker.stop() == 0


def _sessions_on(url: str) -> set[str]:
    """Our sessions on the server, by name (a holder's without its host and pid), and "LISTEN" once the
    fan-out's session has run it."""
    with psycopg.connect(url) as conn:
        sessions = conn.execute(
            "SELECT application_name, query FROM pg_stat_activity WHERE datname = current_database()"
        ).fetchall()
    names = {_HOLDER if name.startswith(f"{_HOLDER} ") else name for name, _ in sessions}
    listening = any(query.upper().startswith("LISTEN") for _, query in sessions)
    return names | ({"LISTEN"} if listening else set())


def _versions_told(bootstrap: str, role_id: UUID, users: list[UUID]) -> dict[str, list[int]]:
    """Each user's versions of the role's change, read from the whole access topic: every user told, and
    none told an older version after a newer."""
    tap = EventTap(bootstrap, [ACCESS_TOPIC], from_beginning=True)
    try:
        events = tap.read_to_end(lambda event: event.payload["changedRoleId"] == str(role_id), timeout_s=120)
    finally:
        tap.close()
    versions = assert_versions_never_go_back((event.key, event.payload["version"]) for event in events)
    assert versions.keys() == {str(user) for user in users}, "a user's event was lost"
    return versions


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_fanout_goes_on_through_a_failover_and_every_job_reconnects_by_itself(
    replicated: ReplicatedPostgres,
    kafka: str,
    settings: Settings,
    subprocess_env: dict[str, str],
    tmp_path: Path,
) -> None:
    url, config = replicated.url(), {"bootstrap.servers": kafka}
    topics = TalentTopics.fresh()
    create_talent_topics(config, 3, tenants_topic=topics.tenants, users_topic=topics.users)
    env = {
        **_on(subprocess_env, url, kafka),
        "PIN_IDENTITY_TALENT_TENANTS_TOPIC": topics.tenants,
        "PIN_IDENTITY_TALENT_USERS_TOPIC": topics.users,
        "PIN_IDENTITY_TALENT_SYNC_GROUP": topics.group,
        # Longer than anything below waits: what is found, is found by LISTEN or by looking after a reconnect.
        "PIN_IDENTITY_FANOUT_POLLING_INTERVAL_S": "30",
    }
    container = Container(settings.model_copy(update={"database_url": url, "kafka_bootstrap_servers": kafka}))
    arrivals = Arrivals(kafka)
    try:
        _, role_id, users = seed.bulk_held_role(container.stores.identity_transactions, url, USERS)
        with (
            _worker(env, "access-fanout,outbox-relay", tmp_path / "fanout.log") as fanout,
            _worker(env, "talent-sync", tmp_path / "talent-sync.log") as sync,
        ):
            for process in (fanout, sync):
                replicated.watch(process.pid)
            seed.change_permissions(container.stores.identity_transactions, role_id, ["x"], QUEUED)
            wait_until(lambda: task_progress(url)[1] >= USERS // 3, "a third of the role told", timeout_s=300)
            before = dict(replicated.connections)
            killed_at = time.monotonic()
            replicated.fail_over()
            moved_at = time.monotonic()
            wait_until(lambda: task_progress(url)[0] == "Completed", "the fan-out completes", timeout_s=300)
            completed_at = time.monotonic()
            wait_until(lambda: outbox_count(url) == 0, "the relay publishes what is left", timeout_s=120)
            # Changes made after the failover: the fan-out hears of a task (LISTEN), talent-sync applies.
            _, small_role, _ = seed.bulk_held_role(container.stores.identity_transactions, url, 20)
            wait_until(lambda: "LISTEN" in _sessions_on(url), "the fan-out listens on the new primary")
            changed_at = time.monotonic()
            seed.change_permissions(container.stores.identity_transactions, small_role, ["y"], QUEUED)
            wait_until(
                lambda: len(arrivals.of_role(small_role)) >= 20, "the later change is published", timeout_s=60
            )
            later_published_s = max(at for at, _ in arrivals.of_role(small_role)) - changed_at
            tenant = talent.tenant()
            snapshot = talent.user(tenant["tenantId"])
            produced_at = time.monotonic()
            produce_to_topics(
                config,
                TalentDataset([tenant], [snapshot]),
                tenants_topic=topics.tenants,
                users_topic=topics.users,
            )
            wait_until(
                lambda: _replica_has(url, snapshot["userId"]),
                "talent-sync applies a later user",
                timeout_s=60,
            )
            applied_s = time.monotonic() - produced_at
            sessions = _sessions_on(url)
            assert fanout.poll() is None and sync.poll() is None, "no process of ours was restarted"
        reconnects = {pid: count - before.get(pid, 0) for pid, count in replicated.connections.items()}
        told = arrivals.of_role(role_id)
    finally:
        arrivals.close()
        container.close()

    after_kill = [at for at, _ in told if at > moved_at]
    print(
        f"failover took {moved_at - killed_at:.1f} s; first event {min(after_kill) - killed_at:.1f} s after"
        f" the kill, completion {completed_at - killed_at:.1f} s after; a later change published in"
        f" {later_published_s:.1f} s, a later Talent user applied in {applied_s:.1f} s; connections opened"
        f" after the failover: fan-out worker {reconnects.get(fanout.pid)},"
        f" talent-sync {reconnects.get(sync.pid)}"
    )
    _versions_told(kafka, role_id, users)
    assert later_published_s < 5, "a task announced after the failover waited for the polling interval"
    assert sessions >= SESSIONS, f"sessions on the new primary: {sessions}"
    assert reconnects.get(fanout.pid, 0) > 0 and reconnects.get(sync.pid, 0) > 0
    audit = run_cli(env, "access", "audit", "--json", timeout=300)
    assert audit.returncode == 0, audit.stderr[-2000:]
    report = json.loads(audit.stdout)
    assert (report["drifted"], report["missing"]) == (0, 0), report


def _replica_has(url: str, talent_user_id: str) -> bool:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT 1 FROM identity.users WHERE external_talent_user_id = %s", (talent_user_id,)
        ).fetchone()
    return row is not None


def _pages_done(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM identity.talent_import_pages WHERE status = 'Done'"
        ).fetchone()
    return int(row[0]) if row else 0


def _import(env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*CLI, "talent-import", "run", "--mode", "api-pull", "--json"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_an_import_goes_on_through_a_failover_and_builds_the_replica_an_uninterrupted_run_builds(
    replicated: ReplicatedPostgres,
    another_database: Callable[[], str],
    settings: Settings,
    subprocess_env: dict[str, str],
    talent_api: SimulatedTalentApi,
) -> None:
    talent_api.dataset = generate_dataset(TENANTS, MANAGERS, seed=45)
    env = {
        **subprocess_env,
        "PIN_IDENTITY_TALENT_API_URL": talent_api.url,
        "PIN_IDENTITY_TALENT_API_TOKEN": "talent-token",
    }
    interrupted = _import({**env, "PIN_IDENTITY_DATABASE_URL": replicated.url()})
    replicated.watch(interrupted.pid)
    try:
        wait_until(lambda: _pages_done(replicated.url()) >= 30, "a part of the import applied", timeout_s=300)
        before = dict(replicated.connections)
        killed_at = time.monotonic()
        replicated.fail_over()
        out, err = interrupted.communicate(timeout=600)
        completed_s = time.monotonic() - killed_at
    finally:
        if interrupted.poll() is None:
            interrupted.kill()
    assert interrupted.returncode == 0, err[-3000:]
    assert json.loads(out)["status"] == "Completed"
    reference_url = another_database()
    uninterrupted = run_cli({**env, "PIN_IDENTITY_DATABASE_URL": reference_url}, "talent-import", "run",
                            "--mode", "api-pull", "--json", timeout=600)  # fmt: skip
    assert uninterrupted.returncode == 0, uninterrupted.stderr[-3000:]
    replica, reference = (_replica_of(settings, url) for url in (replicated.url(), reference_url))
    print(
        f"import completed {completed_s:.1f} s after the kill; connections opened after the failover:"
        f" {replicated.connections[interrupted.pid] - before.get(interrupted.pid, 0)}"
    )
    assert len(replica["users"]) == MANAGERS
    assert replica == reference


def _replica_of(settings: Settings, url: str) -> dict[str, list[tuple[Any, ...]]]:
    container = Container(settings.model_copy(update={"database_url": url}))
    try:
        return talent.replica_state(container)
    finally:
        container.close()


ASYNC_USERS, LOST_USERS = 30_000, 5_000


def _last_outbox_id(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT last_value FROM identity.outbox_events_id_seq").fetchone()
    assert row is not None
    return int(row[0])


def _fanout_settled(url: str) -> bool:
    with psycopg.connect(url) as conn:
        open_tasks = conn.execute(
            "SELECT count(*) FROM identity.access_fanout_tasks WHERE status IN ('Pending', 'InProgress')"
        ).fetchone()
    return open_tasks == (0,) and outbox_count(url) == 0


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_an_asynchronous_standby_promoted_without_the_last_commits_repeats_pages_and_keeps_every_event(
    postgres_admin_url: str,
    kafka: str,
    settings: Settings,
    subprocess_env: dict[str, str],
    tmp_path: Path,
) -> None:
    """Asynchronous replication loses the commits the standby had not received: here the fan-out's pages
    (and their events, already published) past the cut, and the relay's removals. The promoted server resumes
    the task from its older checkpoint (the pages repeat: duplicates, never a reorder), and its id sequence
    steps back below ids the relay already published: rows given those ids again are read and published all
    the same (a new session, a new horizon; removals by id and event id)."""
    with replicated_postgres(synchronous=False) as replicated:
        url = replicated.url()
        env = _on(subprocess_env, url, kafka)
        container = Container(settings.model_copy(update={"database_url": url}))
        arrivals = Arrivals(kafka)
        try:
            _, role_id, users = seed.bulk_held_role(container.stores.identity_transactions, url, ASYNC_USERS)
            with _worker(env, "access-fanout,outbox-relay", tmp_path / "fanout.log"):
                seed.change_permissions(container.stores.identity_transactions, role_id, ["x"], QUEUED)
                wait_until(lambda: task_progress(url)[1] >= ASYNC_USERS // 4, "a quarter told", timeout_s=120)
                replicated.cut_replication()
                lost_from = task_progress(url)[1]
                wait_until(
                    lambda: (
                        len({event.key for _, event in arrivals.of_role(role_id)}) >= lost_from + LOST_USERS
                    ),
                    "pages the standby never receives are committed and published",
                    timeout_s=120,
                )
                ids_handed_out, processed_at_kill = _last_outbox_id(url), task_progress(url)[1]
                replicated.fail_over()
                resumed_at, ids_resumed_from = task_progress(url)[1], _last_outbox_id(url)
                wait_until(
                    lambda: _fanout_settled(url), "the interrupted version is fanned out", timeout_s=300
                )
                seed.change_permissions(container.stores.identity_transactions, role_id, ["x", "y"], QUEUED)
                wait_until(
                    lambda: _fanout_settled(url), "both versions fanned out and published", timeout_s=300
                )
        finally:
            arrivals.close()
            container.close()
    versions = _versions_told(kafka, role_id, users)
    told_twice = sum(1 for seen in versions.values() if seen.count(seen[0]) > 1)
    print(
        f"killed at {processed_at_kill} users told, resumed from {resumed_at}; ids handed out up to"
        f" {ids_handed_out}, the promoted sequence at {ids_resumed_from}; users told a version twice:"
        f" {told_twice}"
    )
    assert resumed_at < processed_at_kill and ids_resumed_from < ids_handed_out, "the loss the test is about"
    assert len({seen[-1] for seen in versions.values()}) == 1, "every user's last event is the later version"
    assert told_twice >= LOST_USERS  # the lost pages were told again


MULTI_HOST_USERS = 20_000


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_multi_host_url_finds_the_promoted_standby_by_itself(
    replicated: ReplicatedPostgres,
    kafka: str,
    settings: Settings,
    subprocess_env: dict[str, str],
    tmp_path: Path,
) -> None:
    """libpq's multi-host form, `target_session_attrs=read-write`, the standby listed first: every session
    of ours lands on the primary, and after the failover on the promoted standby, with no address moved."""
    url = replicated.multi_host_url()
    env = _on(subprocess_env, url, kafka)
    container = Container(settings.model_copy(update={"database_url": url}))
    try:
        _, role_id, users = seed.bulk_held_role(container.stores.identity_transactions, url, MULTI_HOST_USERS)
        with _worker(env, "access-fanout,outbox-relay", tmp_path / "fanout.log") as fanout:
            seed.change_permissions(container.stores.identity_transactions, role_id, ["x"], QUEUED)
            wait_until(lambda: task_progress(url)[1] >= MULTI_HOST_USERS // 3, "a third told", timeout_s=120)
            killed_at = time.monotonic()
            replicated.fail_over()
            wait_until(lambda: _fanout_settled(url), "the fan-out completes and is published", timeout_s=300)
            settled_s = time.monotonic() - killed_at
            assert fanout.poll() is None, "the worker was not restarted"
    finally:
        container.close()
    print(f"completed and published {settled_s:.1f} s after the kill")
    _versions_told(kafka, role_id, users)
