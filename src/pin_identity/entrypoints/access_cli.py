"""`pin-identity access audit`: does the access topic carry every user's current truth (convergence)?
`pin-identity access show USER_ID`: does it for this user (an authorization incident's first question)?"""

from __future__ import annotations

import sys
from typing import Annotated, Any
from uuid import UUID

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from pin_identity.domain.access_verdicts import AuditReport
from pin_identity.entrypoints import cli_output as out
from pin_identity.entrypoints.cli_common import JsonOption, command_group, container_from_env
from pin_identity.operations.documents import UserAccessReport
from pin_identity.operations.ports.access_reads import QueuedAccessEventView

EXIT_DRIFT = 1
# The topic could not be read to its end (a partition stalled or unreachable): the counts are not a verdict.
EXIT_INCOMPLETE = 4

access_app = command_group("The access stream (pin.identity.access.v1).")


@access_app.command("audit")
def access_audit(as_json: JsonOption = False) -> None:
    """Compare each user's last UserAccessChanged on the topic with their Active assignments; exit 1 on drift,
    4 when a partition could not be read to its end.

    Reads every partition from its beginning to the end offsets taken at start. Users whose event is still
    in the outbox count as pending.
    """
    stderr = Console(stderr=True)
    with container_from_env() as container:
        if stderr.is_terminal:
            with _progress_bar(stderr) as bar:
                task = bar.add_task("reading pin.identity.access.v1", total=None)
                report = container.use_cases.access_audit(
                    lambda done, total: bar.update(task, completed=done, total=total)
                )
        else:
            report = container.use_cases.access_audit(lambda done, total: None)
    if as_json:
        out.print_json(report)
    else:
        _print(report)
    if report.incomplete_partitions:
        raise typer.Exit(EXIT_INCOMPLETE)
    if not report.converged:
        raise typer.Exit(EXIT_DRIFT)


def _progress_bar(console: Console) -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )


def _print(report: AuditReport) -> None:
    table = Table("users", "matching", "drifted", "missing", "pending", title="access audit")
    counts = (report.users, report.matching, report.drifted, report.missing, report.pending)
    table.add_row(*(f"{count:,}" for count in counts))
    console = Console(file=sys.stdout)
    console.print(table)
    if report.examples:
        console.print("drifted or missing (up to 20): " + ", ".join(report.examples), soft_wrap=True)
    if report.incomplete_partitions:
        partitions = ", ".join(str(p) for p in report.incomplete_partitions)
        console.print(f"INCOMPLETE: partitions {partitions} not read to their end; the counts are no verdict")
    elif report.converged:
        console.print("converged")
    else:
        console.print("NOT converged: see docs/runbooks.md#access-drift")


# ---------------------------------------------------------------- access show


@access_app.command("show")
def access_show(
    user_id: Annotated[UUID, typer.Argument(help="The user.")],
    as_json: JsonOption = False,
) -> None:
    """One user's Active assignments beside their last UserAccessChanged on the topic, the access events still
    in the outbox, and a verdict: exit 0 when matching or pending, 1 when drifted or missing.

    Reads only the partition the user's key goes to, backwards from its end.
    """
    with container_from_env() as container:
        report = container.use_cases.access_show(user_id)
    if as_json:
        out.print_json(report)
    else:
        _print_access(report)
    if not report.verdict.converged:
        raise typer.Exit(EXIT_DRIFT)


_ASSIGNMENT_COLUMNS = (
    out.Column("assignment id", whole=True),
    out.Column("role", whole=True),
    out.Column("scope"),
    out.Column("expires"),
    out.Column("standing", whole=True),
)


def _print_access(report: UserAccessReport) -> None:
    console = out.stdout()
    verdict = report.verdict.value
    if not report.verdict.converged:
        verdict += "  (docs/runbooks.md#access-drift)"
    out.print_fields(
        [("user", str(report.user_id)), ("company", report.company_id), ("verdict", verdict)],
        title="access show",
        console=console,
    )
    console.print()
    out.print_rows(
        _ASSIGNMENT_COLUMNS,
        _assignment_rows(report),
        title="assignments: Active in the database, or carried by the last event",
        empty="no Active assignment, none in the last event",
        console=console,
    )
    console.print()
    _print_last_event(report, console)
    if report.outbox:
        console.print()
        _print_queued("waiting in the outbox", report.outbox, console)
    if report.dead_letters:
        console.print()
        _print_queued("refused by the broker (outbox_dead_letters)", report.dead_letters, console)


def _assignment_rows(report: UserAccessReport) -> list[tuple[str, ...]]:
    topic = report.last_event.active_assignments if report.last_event is not None else []
    differs = report.difference
    standing = {
        **{a: "only in the database" for a in differs.only_in_database},
        **{a: "only on the topic" for a in differs.only_on_topic},
        **{a: "differs" for a in differs.changed},
    }
    rows, seen = [], set()
    database = [a.model_dump(by_alias=True) for a in report.active_assignments]
    for item in [*database, *(topic if isinstance(topic, list) else [])]:
        if not isinstance(item, dict) or item.get("assignmentId") in seen:
            continue
        seen.add(item.get("assignmentId"))
        rows.append(_assignment_row(item, standing))
    return rows


def _assignment_row(item: dict[str, Any], standing: dict[str, str]) -> tuple[str, ...]:
    assignment = str(item.get("assignmentId"))
    scope = item.get("scopeOrganizationId") or item.get("scopeProjectGroupId") or item.get("scopeProjectId")
    return (
        assignment,
        str(item.get("roleCode")),
        f"{item.get('scopeType')} {scope}" if scope else str(item.get("scopeType")),
        str(item.get("expiresAt") or "-"),
        standing.get(assignment, "same in both"),
    )


def _print_last_event(report: UserAccessReport, console: Console) -> None:
    records = f"{report.records_read:,} record{'' if report.records_read == 1 else 's'}"
    where = f"partition {report.partition}, {records} read from its end"
    if report.partition is None:
        where = "the topic does not exist"
    event = report.last_event
    if event is None:
        console.print(f"last event on pin.identity.access.v1: none ({where})")
        return
    fields = [
        ("partition", event.partition),
        ("offset", event.offset),
        ("version", event.version),
        ("change reason", event.change_reason),
        ("changed role", event.changed_role_id),
        ("occurred at", out.when(event.occurred_at)),
        ("event id", event.event_id),
    ]
    out.print_fields(fields, title=f"last event on pin.identity.access.v1 ({where})", console=console)


_QUEUED_COLUMNS = (
    out.Column("outbox id", whole=True),
    out.Column("change reason", whole=True),
    out.Column("version"),
    out.Column("since"),
    out.Column("error"),
)


def _print_queued(title: str, events: list[QueuedAccessEventView], console: Console) -> None:
    rows = [
        (str(e.outbox_id), e.change_reason or "-", out.text(e.version), out.when(e.queued_at), e.error or "-")
        for e in events
    ]
    out.print_rows(_QUEUED_COLUMNS, rows, title=f"access events {title}", empty="", console=console)
