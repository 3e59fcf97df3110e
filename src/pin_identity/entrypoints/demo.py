"""`pin-identity demo`: the system end to end on the embedded PostgreSQL and broker.

A small role's permission change is announced inline; a large role's goes through the fan-out queue,
the access-fanout job and the outbox relay, and every event is read back from Kafka and checked.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from uuid import UUID

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from pin_identity.adapters.kafka.reader import ReadEvent, TopicReader
from pin_identity.adapters.postgres import demo_data
from pin_identity.composition import Container
from pin_identity.domain.events import ACCESS_TOPIC
from pin_identity.domain.fanout import FanOutPath
from pin_identity.domain.model import CompanyType, Scope, UserType
from pin_identity.entrypoints.worker import Job
from pin_identity.operations import identity

DEMO_TIMEOUT_S = 300


@dataclass
class Check:
    name: str
    ok: bool
    detail: str


@dataclass
class DemoReport:
    rows: list[tuple[str, str]] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)

    def check(self, name: str, ok: bool, detail: str) -> None:
        self.checks.append(Check(name, ok, detail))

    @property
    def passed(self) -> bool:
        return all(check.ok for check in self.checks)


def run_demo(container: Container, *, large_role_users: int, console: Console) -> DemoReport:
    report = DemoReport()
    started = time.monotonic()
    console.print(
        "[bold]pin-identity demo[/bold]: embedded PostgreSQL and broker unless configured otherwise"
    )
    container.upgrade_schema()
    container.ensure_topics()
    report.rows.append(("setup (schema, topics)", f"{time.monotonic() - started:.1f} s"))
    reader = TopicReader(container.kafka_client_config, [ACCESS_TOPIC])
    workers = _Workers(container)
    try:
        small_role = _inline_change(container, report)
        large_role, task_id = _queued_change(container, report, large_role_users, console)
        _follow_fanout(container, task_id, large_role_users, console, report)
        _check_events(reader, report, small_role=small_role, large_role=large_role, users=large_role_users)
    finally:
        workers.stop()
        reader.close()
    report.rows.append(("total", f"{time.monotonic() - started:.1f} s"))
    return report


class _Workers:
    """The worker's jobs, in this process: the fan-out and the relay."""

    def __init__(self, container: Container):
        self._stop = threading.Event()
        jobs: list[Job] = [container.access_fanout(), container.outbox_relay()]
        self._threads = [threading.Thread(target=job.run, args=(self._stop,), daemon=True) for job in jobs]
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(30)


def _company_with_role(container: Container, code: str) -> tuple[UUID, UUID]:
    company_id = identity.create_company(
        container.transactions,
        identity.Context.fresh(),
        name=f"Demo {code}",
        company_type=CompanyType.DEVELOPER,
    )
    role_id = identity.create_role(
        container.transactions, code=code, name=code, company_id=company_id, permissions=["deals.read"]
    )
    return company_id, role_id


def _inline_change(container: Container, report: DemoReport) -> UUID:
    company_id, role_id = _company_with_role(container, "site-manager")
    for n in range(5):
        user_id = identity.create_user(
            container.transactions,
            identity.Context.fresh(),
            identity.NewUser(
                phone=f"8 999 {secrets.randbelow(10_000_000):07d}",
                first_name="Demo",
                last_name=f"Site {n}",
                type=UserType.DEVELOPER_MANAGER,
                company_id=company_id,
            ),
        )
        identity.grant_role_assignment(
            container.transactions,
            identity.Context.fresh(),
            user_id=user_id,
            role_id=role_id,
            scope=Scope.organization(company_id),
        )
    change = identity.set_role_permissions(
        container.transactions,
        identity.Context.fresh(),
        role_id=role_id,
        permissions=["deals.read", "deals.approve"],
        policy=container.fanout_policy,
    )
    report.check(
        "small role notified inline",
        change.path is FanOutPath.INLINE,
        f"{change.users_notified_inline} users",
    )
    return role_id


def _queued_change(
    container: Container, report: DemoReport, users: int, console: Console
) -> tuple[UUID, UUID]:
    company_id, role_id = _company_with_role(container, "sales-manager")
    started = time.monotonic()
    demo_data.add_role_members(container.database, company_id=company_id, role_id=role_id, count=users)
    report.rows.append((f"seed {users:,} role members", f"{time.monotonic() - started:.1f} s"))
    console.print(f"seeded {users:,} users holding one role; changing its permissions")
    change = identity.set_role_permissions(
        container.transactions,
        identity.Context.fresh(),
        role_id=role_id,
        permissions=["deals.read", "deals.approve", "chessboard.view"],
        policy=container.fanout_policy,
    )
    report.check("large role enqueued for fan-out", change.task_id is not None, f"task {change.task_id}")
    assert change.task_id is not None
    return role_id, change.task_id


def _follow_fanout(
    container: Container, task_id: UUID, users: int, console: Console, report: DemoReport
) -> None:
    started = time.monotonic()
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, disable=not console.is_terminal) as progress:
        bar = progress.add_task("fan-out", total=users)
        status, processed, next_line = "Pending", 0, started
        while time.monotonic() - started < DEMO_TIMEOUT_S:
            status, processed = demo_data.fanout_progress(container.database, task_id)
            progress.update(bar, completed=processed)
            if not console.is_terminal and time.monotonic() >= next_line:  # plain lines off a terminal
                console.print(f"fan-out: {status}, {processed:,} of {users:,} users")
                next_line += 2
            if status == "Completed" and demo_data.outbox_is_empty(container.database):
                break
            time.sleep(0.5 if not console.is_terminal else 0.1)
    elapsed = time.monotonic() - started
    report.rows.append(("fan-out: enqueue -> last event acknowledged", f"{elapsed:.1f} s"))
    report.rows.append(("fan-out throughput", f"{processed / elapsed:,.0f} users/s"))
    report.check(
        "fan-out task completed", status == "Completed" and processed == users, f"{processed:,} users"
    )


def _check_events(
    reader: TopicReader, report: DemoReport, *, small_role: UUID, large_role: UUID, users: int
) -> None:
    wanted = {str(small_role): 5, str(large_role): users}
    per_role: dict[str, Counter[str]] = {role: Counter() for role in wanted}
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and any(len(per_role[r]) < n for r, n in wanted.items()):
        for event in reader.read(0.5):
            if _is_permission_change(event) and event.payload["changedRoleId"] in per_role:
                per_role[event.payload["changedRoleId"]][event.key] += 1
    for role, expected in wanted.items():
        received = per_role[role]
        duplicates = sum(received.values()) - len(received)
        label = "inline role" if role == str(small_role) else "fanned-out role"
        report.check(
            f"{label}: one event per user read back from Kafka",
            len(received) == expected,
            f"{len(received):,} of {expected:,} users, {duplicates} duplicates",
        )


def _is_permission_change(event: ReadEvent) -> bool:
    return event.body.get("eventType") == "UserAccessChanged" and (
        event.payload.get("changeReason") == "RolePermissionsChanged"
    )


def print_report(report: DemoReport, console: Console) -> None:
    table = Table("step", "result", title="pin-identity demo")
    for step, result in report.rows:
        table.add_row(step, result)
    for check in report.checks:
        table.add_row(check.name, f"{'PASS' if check.ok else 'FAIL'}: {check.detail}")
    console.print(table)
