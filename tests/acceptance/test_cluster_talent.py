"""Talent's side of a replicated cluster (three nodes, three replicas, two in sync). A talent-sync group of
two `worker --jobs talent-sync` processes and a TopicReplay import (`talent-import run --mode topic-replay`)
consume 20,000 users and their tenants while Talent keeps writing newer versions. The import runs into the
same database as the live group, which docs/integrators.md ("Handover after TopicReplay") allows: the replay
applies through the same version guard, and its handover never moves the live group's offsets back.

Either every node is stopped (SIGTERM) and started in turn, or the node coordinating the group is killed
(SIGKILL). Every user and tenant ends at its latest version, the import completes, no process exits before its
SIGTERM (then with 0), and the group's lag returns to 0. The pauses in applying are printed. A member whose
offset commit fails while the coordinator is lost warns on /readyz that talent-sync cannot commit its offsets,
and a counter of /metrics counts the failed commits."""

from __future__ import annotations

import itertools
import json
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from confluent_kafka.admin import AdminClient

from pin_identity.adapters.kafka.group_lag import consumer_group_lag
from pin_identity.composition import Container
from pin_identity.config import Settings
from pin_identity.domain.errors import BrokerUnavailableError
from pin_identity.simulation.simulated_talent import (
    TalentDataset,
    create_talent_topics,
    generate_dataset,
    produce_to_topics,
)
from tests.support import talent
from tests.support.cli import CLI, launch_worker, unconfigured_environment
from tests.support.cluster import KafkaCluster
from tests.support.health import metric
from tests.support.talent import TalentTopics
from tests.support.waiting import wait_until

PARTITIONS = 6
TENANTS = 200
USERS = 20_000
# Talent's steady writes while nodes go: a tick of this many newer user versions (and one tenant's) a second.
UPDATES_A_TICK = 150
PAUSE_TARGET_S = 30.0
COMMIT_WARNING = "talent-sync cannot commit its offsets: "
STALL_WARNING = "talent-sync has read nothing for "
SAMPLE_EVERY_S = 0.25


@dataclass
class SyncWorker:
    name: str
    base: str
    process: subprocess.Popen[bytes]
    log: Path


@dataclass
class Scene:
    """One test's Talent topics, its database seen through a container, and the processes it started."""

    cluster: KafkaCluster
    topics: TalentTopics
    env: dict[str, str]
    container: Container
    tmp_path: Path
    workers: list[SyncWorker] = field(default_factory=list)

    def consumer_lag(self) -> int | None:
        return self.container.use_cases.health.consumer_lag().total

    def committed(self) -> int | None:
        """The sum of the group's committed offsets; None while the cluster does not say."""
        try:
            lags = consumer_group_lag(
                {"bootstrap.servers": self.cluster.bootstrap},
                self.topics.group,
                [self.topics.tenants, self.topics.users],
            )
        except BrokerUnavailableError:
            return None
        return sum(lag.committed_offset or 0 for lag in lags)

    def coordinator(self) -> int:
        """The node the group's coordinator runs on, as the cluster describes the group."""
        admin = AdminClient({"bootstrap.servers": self.cluster.bootstrap})
        [future] = admin.describe_consumer_groups([self.topics.group], request_timeout=10).values()
        node: int = future.result().coordinator.id
        return node


class Talent(threading.Thread):
    """Talent writing its topics: the dataset once, then newer versions of its users (and a tenant) every
    second until stopped, so that the consumers have something to apply whenever a node goes."""

    def __init__(self, bootstrap: str, topics: TalentTopics, dataset: TalentDataset):
        super().__init__(name="talent-writes", daemon=True)
        self._config, self._topics = {"bootstrap.servers": bootstrap}, topics
        self.users = {user["userId"]: user for user in dataset.users}
        self.tenants = {tenant["tenantId"]: tenant for tenant in dataset.tenants}
        self.stop = threading.Event()
        self.failure: Exception | None = None
        self.written = 0
        self._write(dataset)

    def run(self) -> None:
        users, tenants = list(self.users), list(self.tenants)
        tick = 0
        while not self.stop.wait(1.0):
            first = tick * UPDATES_A_TICK % len(users)
            chosen = users[first : first + UPDATES_A_TICK]
            newer = TalentDataset(
                [_newer(self.tenants[tenants[tick % len(tenants)]], "name")],
                [_newer(self.users[user_id], "lastName") for user_id in chosen],
            )
            try:
                self._write(newer)
            except Exception as exc:  # the test fails on it: what was not delivered has no latest version
                self.failure = exc
                return
            tick += 1

    def _write(self, dataset: TalentDataset) -> None:
        produce_to_topics(
            self._config, dataset, tenants_topic=self._topics.tenants, users_topic=self._topics.users
        )
        self.tenants.update((tenant["tenantId"], tenant) for tenant in dataset.tenants)
        self.users.update((user["userId"], user) for user in dataset.users)
        self.written += len(dataset.tenants) + len(dataset.users)

    def finish(self) -> None:
        self.stop.set()
        self.join(90)
        assert not self.is_alive(), "Talent's last write did not end"
        assert self.failure is None, f"Talent's writes failed: {self.failure}"


def _newer(snapshot: dict[str, Any], renamed: str) -> dict[str, Any]:
    version = snapshot["version"] + 1
    return {**snapshot, "version": version, renamed: f"{snapshot[renamed].split(' #')[0]} #{version}"}


def logged(path: Path) -> Iterator[dict[str, Any]]:
    """A process's JSON log lines (its stderr)."""
    with path.open(encoding="utf-8", errors="replace") as lines:
        for line in lines:
            if line.startswith("{"):
                yield json.loads(line)


def when(line: dict[str, Any]) -> float:
    """A log line's timestamp as seconds since the epoch (what `time.time()` says)."""
    return datetime.fromisoformat(line["timestamp"].replace("Z", "+00:00")).timestamp()


def batches_applied(workers: list[SyncWorker]) -> list[float]:
    """When either worker committed a batch of polled records to the replica, in order: the group consuming
    from Kafka (a retry of quarantined users reads only the database, so it does not count)."""
    return sorted(
        when(line)
        for worker in workers
        for line in logged(worker.log)
        if line.get("event") == "talent-sync-batch-applied"
    )


def first_batch_after(workers: list[SyncWorker], moment: float) -> float | None:
    return next((at for at in batches_applied(workers) if at > moment), None)


def longest_stall(workers: list[SyncWorker], begin: float, end: float) -> float:
    """The longest time between `begin` and `end` without a batch applied."""
    marks = [begin, *(at for at in batches_applied(workers) if begin < at < end), end]
    return max(later - earlier for earlier, later in itertools.pairwise(marks))


def warnings_logged(path: Path, begin: float, end: float) -> Counter[str]:
    """The warning and error events of a log between `begin` and `end`, counted."""
    return Counter(
        line["event"]
        for line in logged(path)
        if line.get("level") in ("warning", "error") and begin <= when(line) <= end
    )


@dataclass
class Seen:
    at: float
    readyz: str  # status and body, or why there was no answer
    lag_gauge: float | None


class Watch(threading.Thread):
    """Every quarter second: what each worker's /readyz and lag gauge say, and whether any process of ours
    has exited."""

    def __init__(self, workers: list[SyncWorker], importer: subprocess.Popen[str]):
        super().__init__(name="watch", daemon=True)
        self.workers, self.importer = workers, importer
        self.exits: list[str] = []
        self.imported_at: float | None = None
        self.seen: dict[str, list[Seen]] = {worker.name: [] for worker in workers}
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(SAMPLE_EVERY_S):
            for worker in self.workers:
                self.seen[worker.name].append(_look(worker))
                if worker.process.poll() is not None and worker.name not in self.exits:
                    self.exits.append(worker.name)
            if self.imported_at is None and self.importer.poll() is not None:
                self.imported_at = time.time()

    def said_between(self, begin: float, end: float) -> dict[str, str]:
        """Per worker, between `begin` and `end`: each distinct /readyz answer, the lag gauge's readings."""
        said = {}
        for name, seen in self.seen.items():
            within = [each for each in seen if begin <= each.at <= end]
            answers = list(dict.fromkeys(each.readyz for each in within))
            gauge = [each.lag_gauge for each in within if each.lag_gauge is not None]
            readings = f"{gauge[0]:g} .. {gauge[-1]:g}, {len(set(gauge))} distinct" if gauge else "none"
            said[name] = f"{len(within)} looks; /readyz {answers}; lag gauge {readings}"
        return said


def _look(worker: SyncWorker) -> Seen:
    at = time.time()
    try:
        ready = httpx.get(f"{worker.base}/readyz", timeout=2)
        scrape = httpx.get(f"{worker.base}/metrics", timeout=2).text
    except httpx.HTTPError as exc:
        return Seen(at, f"no answer ({type(exc).__name__})", None)
    return Seen(at, f"{ready.status_code} {ready.text.strip()}", metric(scrape, "talent_sync_consumer_lag"))


def assert_stall_said(watch: Watch, workers: list[SyncWorker], begin: float, end: float) -> None:
    """A worker that read nothing of a partition with records left for 5 s said so once
    (`talent-sync-stalled`), and on /readyz while it lasted: a warning of two seconds or more is in the
    watch's looks. A member the lost coordinator dropped from the group holds no partition until it rejoins:
    it has nothing to say of partitions, and its failed commits said it (assert_outage_said)."""
    for worker in workers:
        if (
            max(spans_between(worker.log, begin, ("talent-sync-stalled", "talent-sync-flowing")), default=0)
            >= 2
        ):
            answers = [each.readyz for each in watch.seen[worker.name] if begin <= each.at]
            assert any(STALL_WARNING in answer for answer in answers), f"/readyz said: {set(answers)}"


def assert_outage_said(watch: Watch, workers: list[SyncWorker], begin: float, end: float) -> float:
    """Where a worker met the lost coordinator (an offset commit failed meanwhile), /metrics counted the
    failures, and /readyz warned that its offsets were not committed for as long as the coordinator did not
    answer: a warning of a second or more is in the watch's looks (every quarter second). A group whose
    members asked the coordinator nothing until its successor answered met nothing to say. Returns the longest
    warning, in seconds (0 when none was due)."""
    assert_stall_said(watch, workers, begin, end)
    spans = [span for worker in workers for span in commit_failing(worker.log, begin)]
    if not spans:
        return 0.0
    scrapes = [httpx.get(f"{worker.base}/metrics", timeout=5).text for worker in workers]
    failed = sum(warnings_logged(w.log, begin, end)["talent-sync-offset-commit-failed"] for w in workers)
    assert sum(metric(scrape, "talent_sync_offset_commit_failures_total") for scrape in scrapes) >= failed
    if max(spans) >= 1.0:
        answers = [each.readyz for seen in watch.seen.values() for each in seen if begin <= each.at <= end]
        assert any(COMMIT_WARNING in answer for answer in answers), f"/readyz said: {set(answers)}"
    return max(spans)


def commit_failing(log: Path, begin: float) -> list[float]:
    """How long each stretch of failed offset commits after `begin` lasted, by the worker's log: from the
    first failure until the coordinator answered (or until now)."""
    return spans_between(log, begin, ("talent-sync-offset-commit-failed", "talent-sync-coordinator-answers"))


def spans_between(log: Path, begin: float, events: tuple[str, str]) -> list[float]:
    """How long each stretch after `begin` from the first of `events` to the second lasted, by the worker's
    log (the last one until now if it has not ended)."""
    opening, closing = events
    spans, since = [], None
    for line in logged(log):
        if when(line) < begin:
            continue
        if line.get("event") == opening and since is None:
            since = when(line)
        elif line.get("event") == closing and since is not None:
            spans.append(when(line) - since)
            since = None
    return spans if since is None else [*spans, time.time() - since]


def at_most_every(seconds: float, condition: Callable[[], bool]) -> Callable[[], bool]:
    """`condition` asked at most every `seconds` (False in between): for a costly one, such as reading the
    whole replica or the group's offsets, under `wait_until`'s quick polling."""
    asked = [-seconds]

    def throttled() -> bool:
        if time.monotonic() - asked[0] < seconds:
            return False
        asked[0] = time.monotonic()
        return condition()

    return throttled


def start_worker(scene: Scene, name: str) -> SyncWorker:
    launched = launch_worker(scene.env, "talent-sync", scene.tmp_path / f"{name}.log", timeout_s=60)
    return SyncWorker(name, launched.base, launched.process, launched.log)


def stop_worker(worker: SyncWorker) -> int | None:
    if worker.process.poll() is None:
        worker.process.send_signal(signal.SIGTERM)
        try:
            worker.process.wait(60)
        except subprocess.TimeoutExpired:
            worker.process.kill()
            worker.process.wait(10)
            return None
    return worker.process.returncode


def start_import(scene: Scene) -> subprocess.Popen[str]:
    log = scene.tmp_path / "import.log"
    with log.open("wb") as stderr:
        return subprocess.Popen(
            [*CLI, "talent-import", "run", "--mode", "topic-replay", "--json"],
            env=scene.env,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )


def done_pages(scene: Scene) -> int:
    with scene.container.connections.database.connection() as conn:
        row = conn.execute(
            "SELECT count(*) FROM identity.talent_import_pages WHERE status = 'Done'"
        ).fetchone()
    return int(row[0]) if row else 0


@contextmanager
def scene_of(cluster: KafkaCluster, database_url: str, tmp_path: Path) -> Iterator[Scene]:
    topics = TalentTopics.fresh()
    create_talent_topics(
        {"bootstrap.servers": cluster.bootstrap},
        PARTITIONS,
        tenants_topic=topics.tenants,
        users_topic=topics.users,
        replicas=3,
    )
    settings = Settings(
        database_url=database_url,
        kafka_bootstrap_servers=cluster.bootstrap,
        data_dir=tmp_path,
        kafka_topic_partitions=3,
        kafka_replication_factor=3,
        talent_tenants_topic=topics.tenants,
        talent_users_topic=topics.users,
        talent_sync_group=topics.group,
    )
    env = {
        **unconfigured_environment(),
        "PIN_IDENTITY_DATABASE_URL": database_url,
        "PIN_IDENTITY_KAFKA_BOOTSTRAP_SERVERS": cluster.bootstrap,
        "PIN_IDENTITY_DATA_DIR": str(tmp_path),
        "PIN_IDENTITY_KAFKA_TOPIC_PARTITIONS": "3",
        "PIN_IDENTITY_KAFKA_REPLICATION_FACTOR": "3",
        "PIN_IDENTITY_LOG_FORMAT": "json",
        "PIN_IDENTITY_TALENT_TENANTS_TOPIC": topics.tenants,
        "PIN_IDENTITY_TALENT_USERS_TOPIC": topics.users,
        "PIN_IDENTITY_TALENT_SYNC_GROUP": topics.group,
    }
    with ExitStack() as stack:
        container = Container(settings)
        stack.callback(container.close)
        scene = Scene(cluster, topics, env, container, tmp_path)
        stack.callback(lambda: [stop_worker(worker) for worker in scene.workers])
        yield scene


@dataclass
class Running:
    talent: Talent
    importer: subprocess.Popen[str]
    import_launched: float
    watch: Watch


@contextmanager
def consuming(scene: Scene) -> Iterator[Running]:
    """Talent's topics filled and written to, the group's two workers and the import at work: until the
    import applied its first page and the group its first batch."""
    talent_writes = Talent(scene.cluster.bootstrap, scene.topics, generate_dataset(TENANTS, USERS, seed=53))
    scene.workers.extend(start_worker(scene, f"worker-{n}") for n in (1, 2))
    importer, launched = start_import(scene), time.time()
    watch = Watch(scene.workers, importer)
    try:
        talent_writes.start()
        watch.start()
        wait_until(
            at_most_every(0.5, lambda: batches_applied(scene.workers) != []),
            "the group applies",
            timeout_s=120,
        )
        wait_until(at_most_every(0.5, lambda: done_pages(scene) > 0), "the import applies", timeout_s=120)
        yield Running(talent_writes, importer, launched, watch)
    finally:
        watch.stop.set()
        talent_writes.stop.set()
        if importer.poll() is None:
            importer.kill()


def settle(scene: Scene, running: Running) -> dict[str, Any]:
    """Talent stops writing; the import ends and the group catches up. Returns the import's result."""
    assert_none_exited(scene, running)
    out, _ = running.importer.communicate(timeout=300)
    assert running.importer.returncode == 0, (scene.tmp_path / "import.log").read_text()[-3000:]
    running.talent.finish()
    wait_until(
        at_most_every(1.0, lambda: scene.consumer_lag() == 0),
        "the group's committed offsets reach the end",
        timeout_s=240,
    )
    wait_until(
        at_most_every(1.0, lambda: sum(lag_gauge(worker) for worker in scene.workers) == 0),
        "each worker's lag gauge reads 0",
        timeout_s=30,
    )
    scrapes = [httpx.get(f"{worker.base}/metrics", timeout=5).text for worker in scene.workers]
    assert [metric(scrape, "talent_sync_stalled_seconds") for scrape in scrapes] == [0.0, 0.0]
    result: dict[str, Any] = json.loads(out)
    return result


def lag_gauge(worker: SyncWorker) -> float:
    return metric(httpx.get(f"{worker.base}/metrics", timeout=5).text, "talent_sync_consumer_lag")


def replica_of(scene: Scene) -> tuple[dict[str, Any], dict[str, Any]]:
    """Companies (id -> name, version) and users (id -> tenant, last name, version) of the replica."""
    state = talent.replica_state(scene.container)
    companies = {row[0]: (row[1], row[6]) for row in state["companies"]}
    users = {row[0]: (row[1], row[7], row[11]) for row in state["users"]}
    return companies, users


def source_of(talent_writes: Talent) -> tuple[dict[str, Any], dict[str, Any]]:
    companies = {t["tenantId"]: (t["name"], t["version"]) for t in talent_writes.tenants.values()}
    users = {u["userId"]: (u["tenantId"], u["lastName"], u["version"]) for u in talent_writes.users.values()}
    return companies, users


def assert_replica_equals_source(scene: Scene, running: Running) -> None:
    expected = source_of(running.talent)
    # A user read before its tenant waits in the quarantine for its retry: applied within seconds of it.
    wait_until(
        at_most_every(2.0, lambda: replica_of(scene) == expected),
        "the replica equals the source",
        timeout_s=120,
    )
    companies, users = replica_of(scene)
    assert companies == expected[0]
    assert users == expected[1]


def assert_none_exited(scene: Scene, running: Running) -> None:
    """No worker has exited; a crashed one's last words in the message."""
    crashes = [
        f"{worker.name}: {line.get('exception', '').strip().splitlines()[-1:]}"
        for worker in scene.workers
        for line in logged(worker.log)
        if line.get("event") == "worker-job-crashed"
    ]
    assert running.watch.exits == [], f"exited early: {running.watch.exits} {crashes}; see {scene.tmp_path}"


def assert_workers_stayed_and_stop_cleanly(scene: Scene, running: Running) -> None:
    assert_none_exited(scene, running)
    codes = {worker.name: stop_worker(worker) for worker in scene.workers}
    assert set(codes.values()) == {0}, f"exit statuses at SIGTERM: {codes}"


def assert_import_completed(result: dict[str, Any]) -> None:
    assert (result["status"], result["mode"], result["dryRun"]) == ("Completed", "TopicReplay", False)
    assert result["companies"]["failed"] == result["users"]["failed"] == 0, result


def import_timeline(scene: Scene, running: Running, began: float) -> str:
    """When the import process was launched, logged its start and exited, in seconds into the test."""
    started = [
        when(line) for line in logged(scene.tmp_path / "import.log") if line["event"] == "import-started"
    ]
    ended = (running.watch.imported_at or 0.0) - began
    return (
        f"import launched at {running.import_launched - began:.1f} s, started at {started[0] - began:.1f} s,"
        f" ended at {ended:.1f} s"
    )


@pytest.mark.slow  # each node stopped and started in turn under two workers and an import: minutes
@pytest.mark.timeout(720)
def test_a_rolling_restart_under_the_group_and_the_import_loses_nothing_and_stops_no_process(
    cluster: KafkaCluster, database_url: str, tmp_path: Path
) -> None:
    began = time.time()
    with scene_of(cluster, database_url, tmp_path) as scene, consuming(scene) as running:
        workers, pauses = scene.workers, []
        for node in cluster.nodes:
            stopped_at = time.time()
            cluster.stop(node.node_id)
            exited_at = time.time()
            wait_until(
                at_most_every(0.5, lambda at=exited_at: first_batch_after(workers, at) is not None),
                f"the group applies a batch without node {node.node_id}",
                timeout_s=120,
            )
            resumed_at = first_batch_after(workers, exited_at) or 0.0
            cluster.start(node.node_id)
            cluster.wait_in_sync()
            in_sync_at = time.time()
            stall = longest_stall(workers, stopped_at, in_sync_at)
            pauses.append(
                f"node {node.node_id}: SIGTERM at {stopped_at - began:.1f} s, exited"
                f" {exited_at - stopped_at:.1f} s later, a batch applied {resumed_at - stopped_at:.1f} s"
                f" after the SIGTERM, in sync again {in_sync_at - stopped_at:.1f} s after it;"
                f" longest stall meanwhile {stall:.1f} s"
            )
            assert_none_exited(scene, running)
        warned = {w.name: warnings_logged(w.log, began, time.time()) for w in workers}
        result = settle(scene, running)
        assert_import_completed(result)
        assert_replica_equals_source(scene, running)
        assert_workers_stayed_and_stop_cleanly(scene, running)
        print("", *pauses, import_timeline(scene, running, began), sep="\n")
    print(
        f"import {result['companies']} {result['users']}; Talent wrote {running.talent.written} records;"
        f" warnings logged during the restarts {warned}; test body {time.time() - began:.1f} s"
    )


@pytest.mark.slow  # the group's coordinator node killed under two workers and an import: minutes
@pytest.mark.timeout(480)
def test_the_groups_coordinator_node_killed_pauses_applying_at_most_30_s_and_loses_nothing(
    cluster: KafkaCluster, database_url: str, tmp_path: Path
) -> None:
    began = time.time()
    with scene_of(cluster, database_url, tmp_path) as scene, consuming(scene) as running:
        workers = scene.workers
        victim = scene.coordinator()
        committed = scene.committed()
        assert committed is not None
        killed_at = time.time()
        cluster.kill(victim)
        wait_until(
            at_most_every(0.5, lambda: first_batch_after(workers, killed_at) is not None),
            "the group applies a batch after the kill",
            timeout_s=PAUSE_TARGET_S * 3,
        )
        wait_until(
            at_most_every(0.5, lambda: (now := scene.committed()) is not None and now > committed),
            "the group commits offsets after the kill",
            timeout_s=PAUSE_TARGET_S * 3,
        )
        committed_at = time.time()
        wait_until(
            at_most_every(0.5, lambda: scene.coordinator() != victim),
            "another node coordinates the group",
            timeout_s=60,
        )
        successor, recovered_at = scene.coordinator(), time.time()
        first_batch = (first_batch_after(workers, killed_at) or 0.0) - killed_at
        stall = longest_stall(workers, killed_at, recovered_at)
        print(
            f"\ncoordinator node {victim} killed at {killed_at - began:.1f} s; a batch applied"
            f" {first_batch:.1f} s later; longest stall {stall:.1f} s; offsets committed again"
            f" {committed_at - killed_at:.1f} s later; node {successor} coordinates the group"
        )
        said = running.watch.said_between(killed_at, recovered_at)
        for worker in workers:
            logged_meanwhile = dict(warnings_logged(worker.log, killed_at, recovered_at))
            print(f"{worker.name} meanwhile: {said[worker.name]}; logged {logged_meanwhile}")
        warned_s = assert_outage_said(running.watch, workers, killed_at, recovered_at)
        print(f"offsets not committed, the longest stretch: {warned_s:.1f} s")
        result = settle(scene, running)
        assert_import_completed(result)
        assert_replica_equals_source(scene, running)
        assert_workers_stayed_and_stop_cleanly(scene, running)
        print(import_timeline(scene, running, began))
        assert first_batch <= PAUSE_TARGET_S, f"{first_batch:.1f} s from the kill to the next batch applied"
        assert stall <= PAUSE_TARGET_S, f"applying stalled {stall:.1f} s after the kill"
    print(
        f"import {result['companies']} {result['users']}; Talent wrote {running.talent.written} records;"
        f" test body {time.time() - began:.1f} s"
    )
