"""The convergence property (CONTRACTS section 4), end to end: whatever runs at once — grants, revokes,
archives, set-permissions inline and queued, Talent moves and deletions — while the fan-out job works, the
relay restarts and the broker stalls past the delivery timeout, once the outbox is drained the audit finds
every user's last event equal to their Active assignments.

Examples share one database and one broker (of this module's own), so every audit checks the whole history
so far, not only the last example. `CONVERGENCE_EXAMPLES=200 pytest -k convergence_property` runs it longer.
"""

from __future__ import annotations

import os
import random
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

import psycopg
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from pin_identity.adapters.kafka.topics import TopicLayout, ensure_topics
from pin_identity.adapters.system_clock import SYSTEM_CLOCK
from pin_identity.composition import Container
from pin_identity.config import FanOutSettings, RelaySettings, Settings
from pin_identity.domain.errors import IdentityError
from pin_identity.domain.events import PUBLISHED_TOPICS
from pin_identity.domain.fanout_policy import FanOutPolicy
from pin_identity.domain.model import Scope
from pin_identity.jobs.access_fanout import AccessFanOutJob
from pin_identity.operations import identity_changes
from pin_identity.operations.context import Context
from tests.support import seed, talent
from tests.support.brokers import proxied_broker
from tests.support.databases import scratch_database
from tests.support.fanout import NoWakeups
from tests.support.tcp_proxy import TcpProxy

EXAMPLES = int(os.environ.get("CONVERGENCE_EXAMPLES", "6"))
# Deliveries time out within the broker stalls the examples draw (production keeps the default minute).
SHORT_DELIVERY = (
    '{"message.timeout.ms": "2000", "request.timeout.ms": "1000", "reconnect.backoff.max.ms": "100"}'
)


@dataclass
class Stand:
    container: Container
    proxy: TcpProxy
    database_url: str
    tenants: list[str] = field(default_factory=list)


@pytest.fixture(scope="module")
def stand(postgres_admin_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stand]:
    with (
        scratch_database(postgres_admin_url, f"convergence_{uuid.uuid4().hex[:8]}") as database_url,
        proxied_broker(tmp_path_factory.mktemp("kafka")) as broker,
    ):
        configured = Settings(
            database_url=database_url,
            kafka_bootstrap_servers=broker.bootstrap,
            kafka_config=SHORT_DELIVERY,
            data_dir=tmp_path_factory.mktemp("data"),
            worker_http_port=0,
            kafka_topic_partitions=3,
            kafka_replication_factor=1,
        )
        ensure_topics({"bootstrap.servers": broker.bootstrap}, PUBLISHED_TOPICS, TopicLayout(3, 1))
        container = Container(configured)
        built = Stand(container, broker.proxy, database_url)
        for _ in range(2):
            tenant = talent.tenant()
            talent.tenants(container, tenant)
            built.tenants.append(tenant["tenantId"])
        yield built
        container.close()


@dataclass
class Cast:
    """One example's people and roles: local users with local roles, and Talent managers."""

    company: UUID
    roles: list[UUID]
    users: list[UUID]
    managers: list[dict[str, Any]]
    lock: threading.Lock = field(default_factory=threading.Lock)

    def next_version(self, manager: dict[str, Any], **changes: Any) -> dict[str, Any]:
        with self.lock:
            manager.update(changes, version=manager["version"] + 1)
            return dict(manager)


def _cast(stand: Stand) -> Cast:
    transactions = stand.container.stores.identity_transactions
    company = seed.company(transactions)
    roles = [seed.role(transactions, company, code=f"role-{uuid.uuid4().hex[:6]}") for _ in range(2)]
    users = [seed.user(transactions, company) for _ in range(3)]
    for user in users:
        seed.grant(transactions, user, roles[0], company)
    managers = [talent.user(stand.tenants[0]) for _ in range(2)]
    talent.users(stand.container, *managers)
    return Cast(company, roles, users, managers)


Step = tuple[str, int, int]
STEPS = st.tuples(
    st.sampled_from(
        [
            "grant",
            "revoke",
            "set-inline",
            "set-queued",
            "archive",
            "talent-move",
            "talent-delete",
            "relay-restart",
            "broker-stall",
        ]
    ),
    st.integers(0, 9),
    st.integers(0, 9),
)


def _step(stand: Stand, cast: Cast, relay: Relay, step: Step) -> None:
    kind, a, b = step
    ctx, transactions = Context.fresh(SYSTEM_CLOCK), stand.container.stores.identity_transactions
    role = cast.roles[a % len(cast.roles)]
    if kind == "grant":
        identity_changes.grant_role_assignment(
            transactions,
            ctx,
            user_id=cast.users[b % len(cast.users)],
            role_id=role,
            scope=Scope.organization(cast.company),
        )
    elif kind == "revoke":
        assignment = _an_active_assignment(stand, cast, b)
        if assignment is not None:
            identity_changes.revoke_role_assignment(transactions, ctx, assignment)
    elif kind in ("set-inline", "set-queued"):
        target = _developer_manager(stand) if b % 3 == 0 else role
        policy = FanOutPolicy(200 if kind == "set-inline" else 0)
        identity_changes.set_role_permissions(
            transactions, ctx, role_id=target, permissions=[f"p{a}", f"q{b}"], policy=policy
        )
    elif kind == "archive":
        identity_changes.archive_role(transactions, ctx, role)
    elif kind == "talent-move":
        manager = cast.managers[a % len(cast.managers)]
        talent.users(
            stand.container, cast.next_version(manager, tenantId=stand.tenants[b % 2], isDeleted=False)
        )
    elif kind == "talent-delete":
        manager = cast.managers[a % len(cast.managers)]
        talent.users(stand.container, cast.next_version(manager, isDeleted=True))
    elif kind == "relay-restart":
        relay.restart()
    elif kind == "broker-stall":
        stand.proxy.stall()
        restore = threading.Timer(0.5 + b * 0.4, stand.proxy.restore)
        restore.daemon = True
        restore.start()


def _an_active_assignment(stand: Stand, cast: Cast, pick: int) -> UUID | None:
    users = [*cast.users]
    with psycopg.connect(stand.database_url) as conn:
        rows = conn.execute(
            "SELECT id FROM identity.role_assignments"
            " WHERE status = 'Active' AND user_id = ANY(%s) ORDER BY id",
            (users,),
        ).fetchall()
    return rows[pick % len(rows)][0] if rows else None


def _developer_manager(stand: Stand) -> UUID:
    with psycopg.connect(stand.database_url) as conn:
        row = conn.execute(
            "SELECT id FROM identity.role_definitions WHERE code = 'developer-manager' AND company_id IS NULL"
        ).fetchone()
    assert row is not None
    return row[0]


class Relay:
    """The relay in a thread, restartable (a deploy, a crash) while everything else goes on."""

    def __init__(self, container: Container):
        self._container = container
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        self._stop = threading.Event()
        relay = self._container.jobs.outbox_relay(RelaySettings(standby_wait_s=0.1))
        self._thread = threading.Thread(target=relay.run, args=(self._stop,), daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(60)

    def restart(self) -> None:
        with self._lock:
            self.stop()
            self.start()

    def drain(self) -> None:
        with self._lock:
            self.stop()
            relay = self._container.jobs.outbox_relay()
            give_up = threading.Event()
            timer = threading.Timer(120, give_up.set)  # a drain that cannot finish fails the example
            timer.daemon = True
            timer.start()
            relay.run(give_up, once=True)
            timer.cancel()


def _run_concurrently(calls: list[Callable[[], None]], lanes: int = 3) -> list[BaseException]:
    errors: list[BaseException] = []

    def lane(mine: list[Callable[[], None]]) -> None:
        for call in mine:
            try:
                call()
            except IdentityError:
                pass  # a grant on an archived role, a revoke already done: refused, as it should be
            except BaseException as exc:  # anything else (a deadlock, a broken query) fails the example
                errors.append(exc)

    threads = [threading.Thread(target=lane, args=(calls[n::lanes],)) for n in range(lanes)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    return errors


@pytest.mark.slow
@pytest.mark.timeout(60 + 30 * EXAMPLES)
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    print_blob=True,
    # No shrinking: an example is a few seconds of real servers; a failure prints its blob to replay it.
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(steps=st.lists(STEPS, min_size=4, max_size=16), seed_=st.integers(0, 2**16))
def test_the_access_stream_converges_whatever_runs_at_once(
    stand: Stand, steps: list[Step], seed_: int
) -> None:
    cast = _cast(stand)
    random.Random(seed_).shuffle(steps)
    fanout = AccessFanOutJob(
        stand.container.stores.fanout_queue,
        NoWakeups(),
        FanOutSettings(polling_interval_s=0.05, batch_size=2),
        SYSTEM_CLOCK,
    )
    stop_fanout = threading.Event()
    fanout_thread = threading.Thread(target=fanout.run, args=(stop_fanout,), daemon=True)
    relay = Relay(stand.container)
    fanout_thread.start()
    relay.start()
    try:
        errors = _run_concurrently([lambda step=step: _step(stand, cast, relay, step) for step in steps])
        stop_fanout.set()
        fanout_thread.join(60)
        assert errors == []
        fanout.run(threading.Event(), once=True)  # what the background job left queued
        stand.proxy.restore()
        relay.drain()
    finally:
        stop_fanout.set()
        stand.proxy.restore()
        relay.stop()
    report = stand.container.use_cases.access_audit(lambda done, total: None)
    assert (report.drifted, report.missing, report.pending) == (0, 0, 0), report.model_dump_json()
    assert report.users > 0
