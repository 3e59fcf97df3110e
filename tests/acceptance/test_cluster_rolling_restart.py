"""A rolling restart of the three-node cluster under load: while the worker fans out a 200,000-user role's
permission changes and its relay publishes them, each node in turn is stopped (controlled shutdown), started
again and waited for until every replica is in sync. The relay, started cold against the fresh cluster, pauses
at most 10 s per node, its worker stays up, and nothing is lost, reordered or dead-lettered: every user has
the role's versions on the access topic in order, and the access audit finds nothing drifted or missing."""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from uuid import UUID

import httpx
import psycopg
import pytest

from pin_identity.composition import Container
from pin_identity.config import Settings
from pin_identity.domain.events import ACCESS_TOPIC
from pin_identity.domain.fanout_policy import FanOutPolicy
from tests.support import seed
from tests.support.cli import WorkerProcess, run_cli
from tests.support.cluster import NODES, KafkaCluster
from tests.support.health import metric
from tests.support.kafka_tap import EventTap, assert_versions_never_go_back
from tests.support.relay import outbox_count, relay_worker
from tests.support.waiting import wait_until

USERS = 200_000
# The role's version after each change: one change before each node's stop, so that every stop meets a
# fan-out in progress and a relay with a backlog, and later versions overtake earlier ones in the outbox.
VERSIONS = list(range(2, NODES + 2))
# Rows the outbox holds at least when a node is stopped: the relay is busy, not finishing up.
BACKLOG = 10_000
PAUSE_TARGET_S = 10.0
# How often the published count is read from the worker's /metrics: the pauses' resolution.
SAMPLE_EVERY_S = 0.1


@pytest.fixture
def env(cluster_env: dict[str, str]) -> dict[str, str]:
    return {
        **cluster_env,
        "PIN_IDENTITY_FANOUT_BATCH_SIZE": "2000",
        "PIN_IDENTITY_FANOUT_POLLING_INTERVAL_S": "0.5",
    }


class Publishing:
    """Watches the worker from beside it: the moments its count of published events grew (read from its
    /metrics every SAMPLE_EVERY_S), and whether the process ever exited."""

    def __init__(self, worker: WorkerProcess):
        self._worker = worker
        self._stop = threading.Event()
        self.grew_at: list[float] = []
        self.exited: int | None = None
        self._thread = threading.Thread(target=self._watch, name="publishing-watch", daemon=True)

    def _watch(self) -> None:
        published = 0.0
        while not self._stop.wait(SAMPLE_EVERY_S):
            self.exited = self._worker.process.poll()
            if self.exited is not None:
                return
            try:
                scrape = httpx.get(f"{self._worker.base}/metrics", timeout=5).text
            except httpx.TransportError:  # a busy worker answers the next scrape; an exit shows above
                continue
            now = metric(scrape, "identity_outbox_published_total")
            if now > published:
                published = now
                self.grew_at.append(time.monotonic())

    def since(self, moment: float) -> bool:
        return bool(self.grew_at) and self.grew_at[-1] > moment

    def pause(self, stopped_at: float, gone_at: float) -> float:
        """The longest stretch without a published event from the node's SIGTERM until the first event
        published once it is gone: during its controlled shutdown (leaders and coordinators move) or after."""
        grew = list(self.grew_at)
        resumed = next(moment for moment in grew if moment > gone_at)
        moments = [stopped_at, *(moment for moment in grew if stopped_at < moment <= resumed)]
        return max(later - earlier for earlier, later in itertools.pairwise(moments))

    @contextmanager
    def watching(self) -> Iterator[Publishing]:
        self._thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            self._thread.join(10)


def _change(container: Container, role: UUID, version: int) -> None:
    """A permission change queued as a fan-out task (the role's version becomes `version`)."""
    seed.change_permissions(
        container.stores.identity_transactions,
        role,
        [f"deals.read.{version}"],
        FanOutPolicy(inline_threshold=0),
    )


def _versions_fanned_out(database_url: str, role: UUID) -> list[int]:
    with psycopg.connect(database_url) as conn:
        rows = conn.execute(
            "SELECT role_version FROM identity.access_fanout_tasks"
            " WHERE role_id = %s AND status = 'Completed' ORDER BY role_version",
            (role,),
        ).fetchall()
    return [int(row[0]) for row in rows]


def _tasks_left(database_url: str) -> int:
    with psycopg.connect(database_url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM identity.access_fanout_tasks WHERE status <> 'Completed'"
        ).fetchone()
    return int(row[0]) if row else 0


@dataclass(frozen=True)
class Restart:
    backlog: int  # outbox rows when the node was stopped
    shutdown_s: float  # from SIGTERM until the node's process was gone (its controlled shutdown)
    pause_s: float  # the relay's longest stretch without a published event meanwhile (Publishing.pause)

    def __str__(self) -> str:
        return f"{self.pause_s:.1f} s (outbox {self.backlog} rows, shutdown {self.shutdown_s:.1f} s)"


def _restart(cluster: KafkaCluster, node: int, publishing: Publishing, database_url: str) -> Restart:
    """Stop the node while the relay publishes a backlog, start it again, wait until it is in sync."""
    backlog = 0

    def busy() -> bool:
        nonlocal backlog
        backlog = outbox_count(database_url)
        return backlog >= BACKLOG and publishing.since(time.monotonic() - 1)

    wait_until(busy, f"the relay publishes a backlog of at least {BACKLOG} rows", timeout_s=120)
    stopped_at = time.monotonic()
    cluster.stop(node)
    gone_at = time.monotonic()
    wait_until(
        lambda: publishing.since(gone_at), f"the relay publishes again with node {node} down", timeout_s=90
    )
    restart = Restart(backlog, gone_at - stopped_at, publishing.pause(stopped_at, gone_at))
    cluster.start(node)
    cluster.wait_in_sync()
    return restart


def _role_versions(bootstrap: str, role: UUID) -> list[tuple[str, int]]:
    """(user, version) of the role's events on the access topic, in topic order (read_committed, whole)."""
    tap = EventTap(bootstrap, [ACCESS_TOPIC], from_beginning=True)
    try:
        events = tap.read_to_end(lambda e: e.payload["changedRoleId"] == str(role), timeout_s=180)
    finally:
        tap.close()
    return [(event.key, int(event.payload["version"])) for event in events]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_rolling_restart_under_a_200000_user_fanout_pauses_the_relay_briefly_and_loses_nothing(
    env: dict[str, str], settings: Settings, cluster: KafkaCluster, database_url: str, tmp_path: Path
) -> None:
    began = time.monotonic()
    container = Container(settings.model_copy(update={"kafka_bootstrap_servers": cluster.bootstrap}))
    _, role, users = seed.bulk_held_role(container.stores.identity_transactions, database_url, USERS)
    restarts: dict[int, Restart] = {}
    phases = {"seeded": time.monotonic()}
    with relay_worker(env, tmp_path, jobs="access-fanout,outbox-relay") as worker:
        with Publishing(worker).watching() as publishing:
            for node, version in zip(range(1, NODES + 1), VERSIONS, strict=True):
                _change(container, role, version)
                restarts[node] = _restart(cluster, node, publishing, database_url)
            phases["restarted"] = time.monotonic()
            wait_until(
                lambda: _tasks_left(database_url) == 0 and outbox_count(database_url) == 0,
                "every change is fanned out and published",
                timeout_s=300,
            )
            phases["published"] = time.monotonic()
            assert worker.process.poll() is None
        assert publishing.exited is None, f"the worker exited ({publishing.exited}) during the restarts"
    container.close()
    print(
        "rolling restart, relay pause per node: "
        + ", ".join(f"node {node} {restart}" for node, restart in restarts.items())
        + f"; worker exit {worker.process.returncode}"
    )
    assert all(restart.backlog >= BACKLOG for restart in restarts.values())
    assert outbox_count(database_url, "outbox_dead_letters") == 0
    versions = assert_versions_never_go_back(_role_versions(cluster.bootstrap, role))
    phases["read"] = time.monotonic()
    assert versions.keys() == {str(user) for user in users}, "a user's events were lost"
    # A change made while the one before it still waits for the fan-out joins its task (one Pending task per
    # role, carrying the newest version): every user has each version a task carried, the newest last.
    carried = _versions_fanned_out(database_url, role)
    assert carried[-1] == VERSIONS[-1] and set(carried) <= set(VERSIONS), carried
    assert all(set(seen) == set(carried) for seen in versions.values()), "a user missed a version"
    done = run_cli(env, "access", "audit", "--json", timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    audit = json.loads(done.stdout)
    assert (audit["drifted"], audit["missing"], audit["users"]) == (0, 0, USERS)
    phases["audited"] = time.monotonic()
    print(
        "rolling restart, test body "
        + ", ".join(f"{phase} at {moment - began:.0f} s" for phase, moment in phases.items())
    )
    slowest = max(restart.pause_s for restart in restarts.values())
    assert slowest <= PAUSE_TARGET_S, f"the relay paused {slowest:.1f} s, over {PAUSE_TARGET_S:g} s"
