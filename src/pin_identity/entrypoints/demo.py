"""`pin-identity demo`: the system end to end on the embedded PostgreSQL and broker.

A simulated Talent is served over HTTP on loopback and the replica bootstrapped from it (thousands of
companies, tens of thousands of managers, a little poison). Then a small role's permission change is
announced inline, and the developer-manager role, now held by every bootstrapped manager, goes through the
fan-out queue, the access-fanout job and the outbox relay; every event is read back from Kafka and checked.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol
from uuid import UUID

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from pin_identity.composition import Container
from pin_identity.domain.events import ACCESS_TOPIC
from pin_identity.domain.fanout_policy import FanOutPath
from pin_identity.domain.import_run import RunStatus
from pin_identity.domain.model import CompanyType, Scope, UserType
from pin_identity.entrypoints.demo_bootstrap import EXPECTED_QUARANTINE, bootstrap_from_simulated_talent
from pin_identity.operations import identity_changes
from pin_identity.operations.context import Context
from pin_identity.operations.documents import ImportResult
from pin_identity.operations.ports.job_control import Job

DEMO_TIMEOUT_S = 300


class _ReadEvent(Protocol):
    """An event read back from the access topic."""

    @property
    def key(self) -> str: ...
    @property
    def body(self) -> dict[str, Any]: ...
    @property
    def payload(self) -> dict[str, Any]: ...


class _EventReader(Protocol):
    def read_to_end(self, timeout_s: float = 30.0) -> Sequence[_ReadEvent]: ...


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


def run_demo(container: Container, *, companies: int, managers: int, console: Console) -> DemoReport:
    report = DemoReport()
    started = container.clock.monotonic()
    console.print(
        "[bold]pin-identity demo[/bold]: embedded PostgreSQL and broker unless configured otherwise"
    )
    container.connections.upgrade_schema()
    container.connections.ensure_topics()
    report.rows.append(("setup (schema, topics)", f"{container.clock.monotonic() - started:.1f} s"))
    reader = container.use_cases.topic_reader([ACCESS_TOPIC])
    workers = _Workers(container)
    try:
        _bootstrap(container, report, companies, managers, console)
        small_role = _inline_change(container, report)
        large_role, version, task_id, holders = _developer_manager_change(container, report, console)
        _follow_fanout(container, task_id, holders, console, report)
        _check_events(reader, report, small_role=small_role, large_role=(large_role, version), users=holders)
    finally:
        workers.stop()
        reader.close()
    _audit(container, report, console)
    report.rows.append(("total", f"{container.clock.monotonic() - started:.1f} s"))
    return report


def _bootstrap(
    container: Container, report: DemoReport, companies: int, managers: int, console: Console
) -> None:
    console.print(f"bootstrapping {companies:,} companies and {managers:,} managers from a simulated Talent")
    done = bootstrap_from_simulated_talent(container, companies=companies, managers=managers, console=console)
    result = ImportResult.of(done.run, container.clock.now()).model_dump(mode="json")
    items = result["companies"]["planned"] + result["users"]["planned"]
    report.rows.append((f"bootstrap ({result['mode']}, run {result['runId'][:8]})", f"{done.seconds:.1f} s"))
    report.rows.append(("bootstrap throughput", f"{items / done.seconds:,.0f} items/s"))
    for aggregate in ("companies", "users"):
        counts = result[aggregate]
        report.rows.append((f"bootstrap {aggregate}", ", ".join(f"{k} {v:,}" for k, v in counts.items())))
    for code, count in sorted(done.quarantine.items()):
        report.rows.append(("quarantined", f"{count} x {code}"))
    report.check("bootstrap completed", done.run.status is RunStatus.COMPLETED, result["status"])
    report.check(
        "poison quarantined with its reason",
        done.quarantine == EXPECTED_QUARANTINE,
        ", ".join(
            f"{code.removeprefix('IDENTITY_SYNC_')} {n}" for code, n in sorted(done.quarantine.items())
        ),
    )
    report.check(
        "every manager has exactly one default role",
        done.managers_with_one_default_role >= managers,
        f"{done.managers_with_one_default_role:,} managers",
    )


class _Workers:
    """The worker's jobs, in this process: the fan-out and the relay."""

    def __init__(self, container: Container):
        self._stop = threading.Event()
        jobs: list[Job] = [container.jobs.access_fanout(), container.jobs.outbox_relay()]
        self._threads = [threading.Thread(target=job.run, args=(self._stop,), daemon=True) for job in jobs]
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(30)


def _company_with_role(container: Container, code: str) -> tuple[UUID, UUID]:
    company_id = identity_changes.create_company(
        container.stores.identity_transactions,
        Context.fresh(container.clock),
        name=f"Demo {code}",
        company_type=CompanyType.DEVELOPER,
    )
    role_id = identity_changes.create_role(
        container.stores.identity_transactions,
        code=code,
        name=code,
        company_id=company_id,
        permissions=["deals.read"],
    )
    return company_id, role_id


def _inline_change(container: Container, report: DemoReport) -> UUID:
    company_id, role_id = _company_with_role(container, "site-manager")
    for n in range(5):
        user_id = identity_changes.create_user(
            container.stores.identity_transactions,
            Context.fresh(container.clock),
            identity_changes.NewUser(
                phone=f"8 999 {secrets.randbelow(10_000_000):07d}",
                first_name="Demo",
                last_name=f"Site {n}",
                type=UserType.DEVELOPER_MANAGER,
                company_id=company_id,
            ),
        )
        identity_changes.grant_role_assignment(
            container.stores.identity_transactions,
            Context.fresh(container.clock),
            user_id=user_id,
            role_id=role_id,
            scope=Scope.organization(company_id),
        )
    change = identity_changes.set_role_permissions(
        container.stores.identity_transactions,
        Context.fresh(container.clock),
        role_id=role_id,
        permissions=["deals.read", "deals.approve"],
        policy=container.use_cases.fanout_policy,
    )
    report.check(
        "small role notified inline",
        change.path is FanOutPath.INLINE,
        f"{change.users_notified_inline} users",
    )
    return role_id


def _developer_manager_change(
    container: Container, report: DemoReport, console: Console
) -> tuple[UUID, int, UUID, int]:
    with container.stores.replica_transactions() as tx:
        role = tx.default_role()
    holders = container.stores.demo_reads.active_holders(role.role_id)
    console.print(f"changing the permissions of developer-manager, held by {holders:,} users")
    change = identity_changes.set_role_permissions(
        container.stores.identity_transactions,
        Context.fresh(container.clock),
        role_id=role.role_id,
        permissions=["deals.read", "deals.approve", "chessboard.view", f"demo.{secrets.token_hex(3)}"],
        policy=container.use_cases.fanout_policy,
    )
    report.check("large role enqueued for fan-out", change.task_id is not None, f"task {change.task_id}")
    assert change.task_id is not None
    return role.role_id, change.role_version, change.task_id, holders


def _follow_fanout(
    container: Container, task_id: UUID, users: int, console: Console, report: DemoReport
) -> None:
    clock = container.clock
    started = clock.monotonic()
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, disable=not console.is_terminal) as progress:
        bar = progress.add_task("fan-out", total=users)
        status, processed, next_line = "Pending", 0, started
        while clock.monotonic() - started < DEMO_TIMEOUT_S:
            status, processed = container.stores.demo_reads.fanout_progress(task_id)
            progress.update(bar, completed=processed)
            if not console.is_terminal and clock.monotonic() >= next_line:  # plain lines off a terminal
                console.print(f"fan-out: {status}, {processed:,} of {users:,} users")
                next_line += 2
            if status == "Completed" and container.stores.demo_reads.outbox_is_empty():
                break
            time.sleep(0.5 if not console.is_terminal else 0.1)
    elapsed = clock.monotonic() - started
    report.rows.append(("fan-out: enqueue -> last event acknowledged", f"{elapsed:.1f} s"))
    report.rows.append(("fan-out throughput", f"{processed / elapsed:,.0f} users/s"))
    report.check(
        "fan-out task completed", status == "Completed" and processed == users, f"{processed:,} users"
    )


def _check_events(
    reader: _EventReader, report: DemoReport, *, small_role: UUID, large_role: tuple[UUID, int], users: int
) -> None:
    """One event per user for each change, read from where the topic ended when the demo began to where it
    ends now (the outbox is drained: every event of the demo lies below). The large role's are this change's
    version: an earlier run cut short may have left its own change of the role in the outbox."""
    wanted = {str(small_role): 5, str(large_role[0]): users}
    per_role: dict[str, Counter[str]] = {role: Counter() for role in wanted}
    for event in reader.read_to_end(timeout_s=60):
        role = event.payload.get("changedRoleId")
        if not _is_permission_change(event) or role not in per_role:
            continue
        if role == str(large_role[0]) and event.payload["version"] != large_role[1]:
            continue
        per_role[role][event.key] += 1
    for role, expected in wanted.items():
        received = per_role[role]
        duplicates = sum(received.values()) - len(received)
        label = "inline role" if role == str(small_role) else "fanned-out role"
        report.check(
            f"{label}: one event per user read back from Kafka",
            len(received) == expected,
            f"{len(received):,} of {expected:,} users, {duplicates} duplicates",
        )


def _audit(container: Container, report: DemoReport, console: Console) -> None:
    """`access audit`: every user's last event on the topic against the database (convergence)."""
    console.print("access audit: reading pin.identity.access.v1 from the beginning")
    audit = container.use_cases.access_audit(lambda done, total: None)
    counts = (
        f"users {audit.users:,}, matching {audit.matching:,}, drifted {audit.drifted:,}, "
        f"missing {audit.missing:,}, pending {audit.pending:,}"
    )
    report.rows.append(("access audit", counts))
    # A rerun on the same data dir audits every earlier run's users too: their events are still on the topic.
    ok = audit.converged and audit.pending == 0 and not audit.incomplete_partitions
    detail = f"{audit.drifted} drifted, {audit.missing} missing"
    if audit.incomplete_partitions:
        detail += f", partitions {audit.incomplete_partitions} not read to their end"
    report.check("access audit: the topic converged on the database", ok, detail)


def _is_permission_change(event: _ReadEvent) -> bool:
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
