"""`pin-identity talent-import ...`: start or resume the bootstrap, watch it, cancel it, its quarantine."""

from __future__ import annotations

import logging
import signal
import sys
import threading
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated
from uuid import UUID

import typer
from rich.box import SIMPLE_HEAD
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from pin_identity.composition import Container
from pin_identity.domain.errors import InvalidInputError
from pin_identity.domain.import_run import (
    ImportErrorCode,
    ImportMode,
    ImportRequest,
    ImportRun,
    PageProgress,
    PageStatus,
    RunStatus,
)
from pin_identity.domain.talent import ImportStage
from pin_identity.entrypoints import cli_output as out
from pin_identity.entrypoints.cli_common import (
    EXIT_CANCELLED,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_SOURCE_UNAVAILABLE,
    EXIT_STOPPED,
    JsonOption,
    command_group,
    container_from_env,
    operator,
)
from pin_identity.observability.logging import configure_logging
from pin_identity.operations.documents import ImportResult, ImportRunOutcome, ImportRunReport
from pin_identity.operations.ports.import_records import RunLock

# CONTRACTS section 2: the exit status each end of a run maps to (a refusal's: cli_common's table).
RUN_EXIT_STATUS = {
    RunStatus.COMPLETED: EXIT_OK,
    RunStatus.FAILED: EXIT_FAILED,
    RunStatus.CANCELLED: EXIT_CANCELLED,
}

talent_import_app = command_group("The Talent initial import (bootstrap of the replica).")

RunIdArgument = Annotated[UUID, typer.Argument(help="The import run.")]


class ModeChoice(StrEnum):
    """The modes as the command line spells them (ImportMode.parse reads both spellings)."""

    API_PULL = "api-pull"
    TOPIC_REPLAY = "topic-replay"


@talent_import_app.command("run")
def run_command(  # noqa: PLR0917 - one parameter per command-line option
    mode: Annotated[
        ModeChoice, typer.Option("--mode", help="Read Talent's HTTP API or replay its compacted topics.")
    ],
    tenant: Annotated[
        UUID | None, typer.Option("--tenant", help="Only this Talent tenant and its users.")
    ] = None,
    page_size: Annotated[int, typer.Option("--page-size", help="Items per page, 1..2000.")] = 500,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Count only: no replica row, no event.")] = False,
    force: Annotated[
        bool,
        typer.Option("--force", help="Run even if the source lists far fewer companies than the replica."),
    ] = False,
    correlation_id: Annotated[
        UUID | None,
        typer.Option(
            "--correlation-id",
            help="Stamped on the run and on every event it writes, to follow it across systems "
            "(default: a new one).",
        ),
    ] = None,
    log_json: Annotated[
        bool,
        typer.Option(
            "--log-json",
            help="Every log line on stderr, in JSON, instead of the progress bar (off a terminal, always).",
        ),
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Start (or resume) the bootstrap and work on it until it ends; prints TalentInitialImportResult."""
    request = ImportRequest(ImportMode.parse(mode.value), tenant, page_size, dry_run, correlation_id, force)
    with container_from_env() as container:
        raise typer.Exit(run_import(container, request, as_json=as_json, log_json=log_json))


def run_initial_import() -> int:
    """`pin-identity --run-initial-import`: the bootstrap, mode from PIN_IDENTITY_TALENT_IMPORT_MODE."""
    with container_from_env() as container:
        request = ImportRequest(ImportMode.parse(container.settings.talent_import_mode))
        return run_import(container, request, as_json=True)


def run_import(container: Container, request: ImportRequest, *, as_json: bool, log_json: bool = False) -> int:
    """SIGTERM (an orchestrator stopping the pod: an eviction, a node drained) stops after the current page
    and leaves the run Running for the next `talent-import run` (or any worker) to resume; SIGINT (Ctrl-C)
    cancels it after the current page. Both are caught from the start: neither kills a half-made run."""
    signals = Signals(threading.Event(), threading.Event())
    signal.signal(signal.SIGTERM, lambda *_: signals.stop.set())
    signal.signal(signal.SIGINT, lambda *_: signals.interrupt())
    container.connections.check_database_grants(["talent-import"])
    show_progress = _progress_or_logs(container, log_json)
    run, lock = container.use_cases.imports.run(request, who=operator())
    final = _drive(container, lock, run, signals, show_progress=show_progress)
    if final.status is RunStatus.RUNNING:
        print(
            f"run {final.run_id} stopped after its current page and left Running (SIGTERM): the next "
            "`talent-import run` with the same options resumes it, as does any `worker --jobs talent-import`",
            file=sys.stderr,
        )
        return EXIT_STOPPED
    result = ImportResult.of(final, container.clock.now())
    if as_json:
        out.print_json(result)
    else:
        _print_result(result, final)
    if final.error_code == ImportErrorCode.SOURCE_UNAVAILABLE.value:
        return EXIT_SOURCE_UNAVAILABLE
    return RUN_EXIT_STATUS.get(final.status, EXIT_FAILED)


def _progress_or_logs(container: Container, log_json: bool) -> bool:
    """On a terminal: a progress bar and a few lines, the log keeping only warnings and audit lines (a page
    logs a line or two: hundreds would be glued onto the bar). Every log line, and no bar, off a terminal or
    when asked for (`--log-json`, PIN_IDENTITY_LOG_FORMAT). Returns whether to show the bar."""
    if log_json:
        configure_logging("json")
        return False
    if not sys.stderr.isatty() or container.settings.log_format is not None:
        return False
    configure_logging("console", level=logging.WARNING)
    return True


@dataclass(frozen=True)
class Signals:
    stop: threading.Event  # SIGTERM, and SIGINT
    cancel: threading.Event  # SIGINT

    def interrupt(self) -> None:
        self.cancel.set()
        self.stop.set()  # wakes the job's waits


def _drive(
    container: Container, lock: RunLock, run: ImportRun, signals: Signals, *, show_progress: bool
) -> ImportRun:
    """The job works in a thread; this one shows progress."""
    job = container.jobs.talent_import(lock=lock)
    outcome: list[ImportRun] = []
    crashed: list[Exception] = []

    def drive() -> None:
        try:
            outcome.append(job.drive(run, signals.stop, cancel=signals.cancel))
        except Exception as exc:  # raised again below: the command fails with it, never "stopped (SIGTERM)"
            crashed.append(exc)

    worker = threading.Thread(target=drive, name="talent-import")
    worker.start()
    if show_progress:
        _show_progress(container, run, worker)
    worker.join()
    if crashed:
        raise crashed[0]
    return outcome[0]


def _show_progress(container: Container, run: ImportRun, worker: threading.Thread) -> None:
    console = Console(stderr=True)
    dry = ", dry run" if run.dry_run else ""
    console.print(f"run {run.run_id} ({run.mode.value}, {run.page_size} items a page{dry})")
    console.print("Ctrl-C cancels it after the pages in hand")
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console) as bar:
        configure_logging("console", level=logging.WARNING)  # through the bar's console: above the bar
        tasks = {stage: bar.add_task(f"{stage.value} pages", total=None) for stage in ImportStage}
        while worker.is_alive():
            _advance(bar, tasks, container.use_cases.imports.pages(run.run_id))
            worker.join(0.5)
        # The last frame: the run's real totals.
        _advance(bar, tasks, container.use_cases.imports.pages(run.run_id))
    configure_logging("console", level=logging.WARNING)  # stderr is itself again


def _advance(bar: Progress, tasks: dict[ImportStage, TaskID], pages: PageProgress) -> None:
    for stage, task in tasks.items():
        bar.update(task, completed=pages.count(stage, PageStatus.DONE), total=pages.count(stage) or None)


def _counters(result: ImportRunOutcome, title: str) -> Table:
    table = Table(
        "aggregate",
        "planned",
        "applied",
        "skipped",
        "failed",
        title=title,
        title_justify="left",
        box=SIMPLE_HEAD,
    )
    for aggregate, counters in (("companies", result.companies), ("users", result.users)):
        counts = (counters.planned, counters.applied, counters.skipped, counters.failed)
        table.add_row(aggregate, *(out.text(count) for count in counts))
    return table


def _print_result(result: ImportResult, run: ImportRun) -> None:
    console = out.stdout()
    console.print(_counters(result, f"run {run.run_id}"))
    dry = " (dry run)" if run.dry_run else ""
    console.print(f"{run.mode.value} {run.status.value}{dry} in {result.duration_ms / 1000:.1f} s")
    if run.error:
        console.print(f"{run.error_code}: {run.error}")


# ---------------------------------------------------------------- watching and operating a run


@talent_import_app.command("status")
def status_command(
    run_id: Annotated[UUID | None, typer.Argument(help="The run (default: the newest).")] = None,
    as_json: JsonOption = False,
) -> None:
    """Progress of a run: counters, pages by stage and status, an ETA, and who holds the run lock."""
    with container_from_env() as container:
        report = container.use_cases.imports.report(run_id)
    if as_json:
        out.print_json(report)
    else:
        _print_status(report)


def _print_status(report: ImportRunReport) -> None:
    console = out.stdout()
    eta = f"about {report.eta_seconds:,.0f} s" if report.eta_seconds is not None else None
    fields: list[tuple[str, object]] = [
        ("run", report.run_id),
        ("mode", report.mode.value),
        ("status", report.status.value),
        ("dry run", report.dry_run),
        ("started", out.when(report.started_at)),
        ("finished", out.when(report.finished_at) if report.finished_at else None),
        ("duration", f"{report.duration_ms / 1000:,.1f} s"),
        ("still listing", report.planning.value if report.planning else "nothing: every page is planned"),
        ("ETA", eta),
        ("run lock held by", report.lock_holder or "nobody"),
        ("correlation id", report.correlation_id),
    ]
    if report.error_code:
        fields.append(("error", f"{report.error_code}: {report.error}"))
    out.print_fields(fields, title="import run", console=console)
    console.print()
    console.print(_counters(report, "items"))
    console.print(_pages(report))


def _pages(report: ImportRunReport) -> Table:
    table = Table(
        "stage",
        *(status.value for status in PageStatus),
        title="pages",
        title_justify="left",
        box=SIMPLE_HEAD,
    )
    for stage in ImportStage:
        table.add_row(stage.value, *(out.text(report.page_count(stage, status)) for status in PageStatus))
    return table


@talent_import_app.command("cancel")
def cancel_command(run_id: RunIdArgument) -> None:
    """Cancel a Running run: pages already claimed finish, Done pages are kept."""
    with container_from_env() as container:
        container.use_cases.imports.cancel(run_id, who=operator())
    typer.echo(f"run {run_id} is Cancelled")


@talent_import_app.command("reset-leases")
def reset_leases_command(run_id: RunIdArgument) -> None:
    """The runbook's "stuck" case: every InProgress page of the run becomes claimable now."""
    with container_from_env() as container:
        pages = container.use_cases.imports.reset_leases(run_id, who=operator())
    typer.echo(f"{pages} pages claimable again")


ConsumerOption = Annotated[
    bool,
    typer.Option("--consumer", help="The continuous talent-sync consumer's quarantine instead of a run's."),
]
OptionalRunId = Annotated[UUID | None, typer.Argument(help="The import run (or --consumer).")]


def _quarantine_owner(run_id: UUID | None, consumer: bool) -> UUID | None:
    """Whose quarantine: a run's or, with --consumer, the consumer's (run_id null)."""
    if consumer == (run_id is not None):
        raise InvalidInputError("name an import run or --consumer, not both and not neither")
    return run_id


_ITEM_COLUMNS = (
    out.Column("item id", whole=True),
    out.Column("stage"),
    out.Column("talent id", whole=True),
    out.Column("error code", whole=True),
    out.Column("reason"),
    out.Column("attempts"),
    out.Column("since"),
)


@talent_import_app.command("failed-items")
def failed_items_command(
    run_id: OptionalRunId = None, consumer: ConsumerOption = False, as_json: JsonOption = False
) -> None:
    """A quarantine: stage, Talent id, error code and reason (payloads stay in the database: PII)."""
    owner = _quarantine_owner(run_id, consumer)
    with container_from_env() as container:
        items = container.use_cases.imports.failed_items(owner)
    if as_json:
        out.print_json(items)
        return
    rows = [
        (
            str(item.item_id),
            item.stage.value,
            str(item.external_id or ""),
            item.error_code,
            item.reason or "",
            out.text(item.attempts),
            out.when(item.created_at),
        )
        for item in items
    ]
    title = f"quarantine of {'the talent-sync consumer' if consumer else f'run {run_id}'}, oldest first"
    out.print_rows(_ITEM_COLUMNS, rows, title=title, empty="the quarantine is empty", console=out.stdout())


@talent_import_app.command("replay-failed")
def replay_failed_command(
    run_id: OptionalRunId = None,
    items: Annotated[
        list[UUID] | None, typer.Option("--item", help="A quarantined item (repeatable).")
    ] = None,
    consumer: ConsumerOption = False,
    as_json: JsonOption = False,
) -> None:
    """Apply quarantined items again after fixing their cause; those that apply leave the quarantine."""
    owner = _quarantine_owner(run_id, consumer)
    with container_from_env() as container:
        replayed = container.use_cases.imports.replay_failed(owner, items or None, who=operator())
    if as_json:
        out.print_json(replayed)
        return
    fields = [
        ("applied", replayed.applied),
        ("skipped", replayed.skipped),
        ("failed", replayed.failed),
        ("not replayable (snapshot pruned)", replayed.not_replayable),
    ]
    out.print_fields(fields, title="quarantined items applied again", console=out.stdout())
