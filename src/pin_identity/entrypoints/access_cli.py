"""`pin-identity access audit`: does the access topic carry every user's current truth (convergence)?"""

from __future__ import annotations

import json
import sys

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from pin_identity.domain.access_audit import AuditReport
from pin_identity.entrypoints.cli_common import JsonOption, command_group, container_from_env

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
                report = container.access_audit(
                    lambda done, total: bar.update(task, completed=done, total=total)
                )
        else:
            report = container.access_audit(lambda done, total: None)
    if as_json:
        typer.echo(json.dumps(report.to_json()))
    else:
        _print(report)
    if report.incomplete:
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
    if report.incomplete:
        partitions = ", ".join(str(p) for p in report.incomplete)
        console.print(f"INCOMPLETE: partitions {partitions} not read to their end; the counts are no verdict")
    elif report.converged:
        console.print("converged")
    else:
        console.print("NOT converged: see docs/runbooks.md#access-drift")
