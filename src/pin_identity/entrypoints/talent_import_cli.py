"""`pin-identity talent-import ...`: start or resume the bootstrap, watch it, cancel it, its quarantine."""

from __future__ import annotations

import json
import signal
import sys
import threading
from datetime import datetime
from typing import Annotated, Any
from uuid import UUID

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from pin_identity.composition import Container
from pin_identity.config import ConfigurationError
from pin_identity.domain.errors import ImportNotRunningError, InvalidInputError, NotFoundError
from pin_identity.domain.events import now_utc
from pin_identity.domain.talent import ImportStage
from pin_identity.domain.talent_import import (
    ImportErrorCode,
    ImportMode,
    ImportRefusedError,
    ImportRequest,
    ImportRun,
    PageProgress,
    PageStatus,
    RunStatus,
)
from pin_identity.entrypoints.cli_common import JsonOption, container_from_env, emit, operator
from pin_identity.jobs.talent_import import start_run
from pin_identity.observability.logging import get_logger
from pin_identity.operations.identity import Context
from pin_identity.operations.talent_replica import replay_quarantined

log = get_logger("cli")
EXIT_BAD_INPUT = 2
# CONTRACTS section 2: the exit status each refusal or end maps to.
REFUSAL_EXIT_STATUS = {
    ImportErrorCode.INVALID_REQUEST: 2,
    ImportErrorCode.RESUME_MISMATCH: 2,
    ImportErrorCode.ALREADY_RUNNING: 3,
    ImportErrorCode.SOURCE_UNAVAILABLE: 4,
    ImportErrorCode.SOURCE_INCOMPLETE: 4,
}
RUN_EXIT_STATUS = {RunStatus.COMPLETED: 0, RunStatus.FAILED: 1, RunStatus.CANCELLED: 5}

talent_import_app = typer.Typer(
    help="The Talent initial import (bootstrap of the replica).", no_args_is_help=True
)

RunIdArgument = Annotated[UUID, typer.Argument(help="The import run.")]


def exit_status(refusal: ImportRefusedError) -> int:
    return REFUSAL_EXIT_STATUS.get(refusal.code, 1)


def _refused(exc: ImportRefusedError) -> typer.Exit:
    typer.echo(f"error: {exc}", err=True)
    return typer.Exit(exit_status(exc))


@talent_import_app.command("run")
def run_command(  # noqa: PLR0917 - one parameter per command-line option
    mode: Annotated[str, typer.Option("--mode", help="api-pull or topic-replay.")],
    tenant: Annotated[
        UUID | None, typer.Option("--tenant", help="Only this Talent tenant and its users.")
    ] = None,
    page_size: Annotated[int, typer.Option("--page-size", help="Items per page, 1..2000.")] = 500,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Count only: no replica row, no event.")] = False,
    force: Annotated[
        bool,
        typer.Option("--force", help="Run even if the source lists far fewer companies than the replica."),
    ] = False,
    correlation_id: Annotated[UUID | None, typer.Option("--correlation-id")] = None,
    as_json: JsonOption = False,
) -> None:
    """Start (or resume) the bootstrap and work on it until it ends; prints TalentInitialImportResult."""
    try:
        request = ImportRequest(ImportMode.parse(mode), tenant, page_size, dry_run, correlation_id, force)
    except ImportRefusedError as exc:
        raise _refused(exc) from None
    with container_from_env() as container:
        raise typer.Exit(run_import(container, request, as_json=as_json))


def run_initial_import() -> int:
    """`pin-identity --run-initial-import`: the bootstrap, mode from PIN_IDENTITY_TALENT_IMPORT_MODE."""
    with container_from_env() as container:
        request = ImportRequest(ImportMode.parse(container.settings.talent_import_mode))
        return run_import(container, request, as_json=True)


def run_import(container: Container, request: ImportRequest, *, as_json: bool) -> int:
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):  # from the start: a SIGTERM never kills a half-made run
        signal.signal(signum, lambda *_: stop.set())
    lock = container.run_lock()
    _require_topics_source(container, request.mode)
    source = container.talent_source(request.mode)
    try:
        run = start_run(container.import_store, lock, source, request, now_utc())
    except ImportRefusedError as exc:
        raise _refused(exc) from None
    finally:
        source.close()
    log.info("admin-action", action="talent-import-run", run_id=str(run.run_id), who=operator())
    final = _drive_with_progress(container, lock, run, stop)
    result = final.result(now_utc())
    if as_json:
        typer.echo(json.dumps(result))
    else:
        _print_result(result, final)
    if final.error_code == ImportErrorCode.SOURCE_UNAVAILABLE.value:
        return REFUSAL_EXIT_STATUS[ImportErrorCode.SOURCE_UNAVAILABLE]
    return RUN_EXIT_STATUS.get(final.status, 1)


def _require_topics_source(container: Container, mode: ImportMode) -> None:
    """TopicReplay's source is the broker: unreachable, it is the source that is unavailable (exit 4), said in
    seconds and one line rather than after librdkafka's retries and log lines."""
    if mode is not ImportMode.TOPIC_REPLAY:
        return
    try:
        container.require_broker()
    except ConfigurationError as exc:
        raise _refused(ImportRefusedError(ImportErrorCode.SOURCE_UNAVAILABLE, str(exc))) from None


def _drive_with_progress(container: Container, lock: Any, run: ImportRun, stop: threading.Event) -> ImportRun:
    """The job works in a thread; this one shows progress. SIGTERM/SIGINT cancel after the current page."""
    job = container.talent_import(lock=lock)
    outcome: list[ImportRun] = []
    worker = threading.Thread(target=lambda: outcome.append(job.drive(run, stop)), name="talent-import")
    worker.start()
    if sys.stderr.isatty():
        _show_progress(container, run, worker)
    worker.join()
    return outcome[0] if outcome else (container.import_store.load_run(run.run_id) or run)


def _show_progress(container: Container, run: ImportRun, worker: threading.Thread) -> None:
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True), transient=False) as bar:
        tasks = {stage: bar.add_task(f"{stage.value} pages", total=None) for stage in ImportStage}
        while worker.is_alive():
            progress = container.import_store.progress(run.run_id)
            for stage, task in tasks.items():
                bar.update(
                    task,
                    completed=progress.count(stage, PageStatus.DONE),
                    total=progress.count(stage) or None,
                )
            worker.join(0.5)


def _print_result(result: dict[str, Any], run: ImportRun) -> None:
    table = Table("aggregate", "planned", "applied", "skipped", "failed", title=f"run {result['runId']}")
    for aggregate in ("companies", "users"):
        counts = result[aggregate]
        table.add_row(aggregate, *(str(counts[k]) for k in ("planned", "applied", "skipped", "failed")))
    console = Console()
    console.print(table)
    dry = " (dry run)" if result["dryRun"] else ""
    console.print(f"{result['mode']} {result['status']}{dry} in {result['durationMs'] / 1000:.1f} s")
    if run.error:
        console.print(f"{run.error_code}: {run.error}")


# ---------------------------------------------------------------- watching and operating a run


def _eta_seconds(run: ImportRun, progress: PageProgress, now: datetime) -> float | None:
    """From the pace of Done pages so far; unknown while the source is still being listed."""
    done, total = progress.count(status=PageStatus.DONE), progress.count()
    elapsed = (now - run.started_at).total_seconds()
    if run.status is not RunStatus.RUNNING or run.planning_stage is not None or not done or elapsed <= 0:
        return None
    return round((total - done) * elapsed / done, 1)


def status_report(container: Container, run: ImportRun) -> dict[str, Any]:
    now = now_utc()
    progress = container.import_store.progress(run.run_id)
    pages = {
        stage.value: {status.value: progress.count(stage, status) for status in PageStatus}
        for stage in ImportStage
    }
    return {
        **run.result(now),
        "startedAt": run.started_at.isoformat(),
        "finishedAt": run.finished_at.isoformat() if run.finished_at else None,
        "planning": run.planning_stage.value if run.planning_stage else None,
        "pages": pages,
        "etaSeconds": _eta_seconds(run, progress, now),
        "lockHolder": container.run_lock().holder(),
        "errorCode": run.error_code,
        "error": run.error,
    }


def _existing_run(container: Container, run_id: UUID) -> ImportRun:
    """An unknown id is an error with the HTTP API's code for it, never an empty answer or a no-op."""
    run = container.import_store.load_run(run_id)
    if run is None:
        raise NotFoundError(f"import run {run_id} does not exist")
    return run


@talent_import_app.command("status")
def status_command(
    run_id: Annotated[UUID | None, typer.Argument(help="The run (default: the newest).")] = None,
    as_json: JsonOption = False,
) -> None:
    """Progress of a run: counters, pages by stage and status, an ETA, and who holds the run lock."""
    with container_from_env() as container:
        run = _existing_run(container, run_id) if run_id else container.import_store.latest_run()
        if run is None:
            raise NotFoundError("there is no import run yet")
        emit(status_report(container, run), as_json)


@talent_import_app.command("cancel")
def cancel_command(run_id: RunIdArgument) -> None:
    """Cancel a Running run: pages already claimed finish, Done pages are kept."""
    with container_from_env() as container:
        if not container.import_store.request_cancel(run_id):
            run = _existing_run(container, run_id)
            raise ImportNotRunningError(f"import run {run_id} is {run.status.value}, not Running")
        log.info("admin-action", action="talent-import-cancel", run_id=str(run_id), who=operator())
        log.info("import-cancelled", run_id=str(run_id), by=operator())
    typer.echo(f"run {run_id} is Cancelled")


@talent_import_app.command("reset-leases")
def reset_leases_command(run_id: RunIdArgument) -> None:
    """The runbook's "stuck" case: every InProgress page of the run becomes claimable now."""
    with container_from_env() as container:
        _existing_run(container, run_id)
        count = container.import_store.reset_leases(run_id)
        log.info(
            "admin-action",
            action="talent-import-reset-leases",
            run_id=str(run_id),
            pages=count,
            who=operator(),
        )
    typer.echo(f"{count} pages claimable again")


ConsumerOption = Annotated[
    bool,
    typer.Option("--consumer", help="The continuous talent-sync consumer's quarantine instead of a run's."),
]
OptionalRunId = Annotated[UUID | None, typer.Argument(help="The import run (or --consumer).")]


def _quarantine_owner(container: Container, run_id: UUID | None, consumer: bool) -> UUID | None:
    """Whose quarantine: a run's (which must exist) or, with --consumer, the consumer's (run_id null)."""
    if consumer == (run_id is not None):
        raise InvalidInputError("name an import run or --consumer, not both and not neither")
    if run_id is not None:
        _existing_run(container, run_id)
    return run_id


@talent_import_app.command("failed-items")
def failed_items_command(
    run_id: OptionalRunId = None, consumer: ConsumerOption = False, as_json: JsonOption = False
) -> None:
    """A quarantine: stage, Talent id, error code and reason (payloads stay in the database: PII)."""
    with container_from_env() as container:
        items = container.import_store.failed_items(_quarantine_owner(container, run_id, consumer))
    if as_json:
        typer.echo(json.dumps(items, default=str))
        return
    table = Table("id", "stage", "talent id", "error code", "reason", "attempts", "since")
    for item in items:
        table.add_row(
            str(item["id"]),
            item["stage"],
            str(item["externalId"] or ""),
            item["errorCode"],
            item["reason"] or "",
            str(item["attempts"]),
            f"{item['createdAt']:%Y-%m-%d %H:%M:%S}",
        )
    Console().print(table)


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
    with container_from_env() as container:
        owner = _quarantine_owner(container, run_id, consumer)
        batch = replay_quarantined(
            container.replica_transactions, Context.fresh(), run_id=owner, item_ids=items or None
        )
        log.info(
            "admin-action",
            action="talent-sync-replay-failed" if consumer else "talent-import-replay-failed",
            run_id=str(owner) if owner else None,
            items=[str(i) for i in items or []],
            who=operator(),
        )
    emit({"applied": batch.applied, "skipped": batch.skipped, "failed": batch.failed}, as_json)
