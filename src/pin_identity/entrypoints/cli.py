"""`pin-identity`: the command line of CONTRACTS section 2. Commands parse input, call one use case."""

from __future__ import annotations

import json
import logging
import sys
import traceback
from datetime import timedelta
from typing import Annotated
from uuid import UUID

import typer
from rich.console import Console
from rich.table import Table

from pin_identity.adapters.postgres import retention
from pin_identity.composition import dependency_error
from pin_identity.config import ConfigurationError, Settings, load_settings
from pin_identity.domain.errors import IdentityError
from pin_identity.domain.events import now_utc
from pin_identity.domain.model import FanOutTaskStatus
from pin_identity.entrypoints import worker as worker_entry
from pin_identity.entrypoints.access_cli import access_app
from pin_identity.entrypoints.cli_common import JsonOption, container_from_env, emit, operator
from pin_identity.entrypoints.embedded_cli import embedded_info
from pin_identity.entrypoints.talent_import_cli import run_initial_import, talent_import_app
from pin_identity.observability.logging import configure_logging, describe_error, get_logger
from pin_identity.operations import identity

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2
log = get_logger("cli")

app = typer.Typer(
    name="pin-identity",
    help="Background jobs of the identity service.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
db_app = typer.Typer(help="Database schema.", no_args_is_help=True)
kafka_app = typer.Typer(help="Kafka topics.", no_args_is_help=True)
roles_app = typer.Typer(help="Role definitions.", no_args_is_help=True)
fanout_app = typer.Typer(help="The access fan-out queue.", no_args_is_help=True)
maintenance_app = typer.Typer(help="Retention.", no_args_is_help=True)
embedded_app = typer.Typer(help="The embedded PostgreSQL and broker used when no URL is configured.")
app.add_typer(db_app, name="db")
app.add_typer(kafka_app, name="kafka")
app.add_typer(roles_app, name="roles")
app.add_typer(fanout_app, name="fanout")
app.add_typer(embedded_app, name="embedded")
embedded_app.command("info")(embedded_info)
app.add_typer(maintenance_app, name="maintenance")
app.add_typer(talent_import_app, name="talent-import")
app.add_typer(access_app, name="access")


@app.callback(invoke_without_command=True)
def root(
    ctx: typer.Context,
    initial_import: Annotated[
        bool,
        typer.Option(
            "--run-initial-import",
            help="Run the Talent bootstrap (mode from PIN_IDENTITY_TALENT_IMPORT_MODE) and exit.",
        ),
    ] = False,
) -> None:
    if initial_import:
        raise typer.Exit(run_initial_import())
    if ctx.invoked_subcommand is None:
        typer.echo(ctx.get_help())


@db_app.command("upgrade")
def db_upgrade() -> None:
    """Apply schema migrations (idempotent; safe when several pods run it at once)."""
    with container_from_env() as container:
        container.upgrade_schema()
        typer.echo("schema is up to date")


@kafka_app.command("ensure-topics")
def kafka_ensure_topics(as_json: JsonOption = False) -> None:
    """Create missing pin.identity.* topics (compacted)."""
    with container_from_env() as container:
        container.require_broker()
        created = container.ensure_topics()
        emit({"created": created}, as_json)


@roles_app.command("set-permissions")
def roles_set_permissions(
    role_id: Annotated[UUID, typer.Argument(help="The role whose permission set is replaced.")],
    codes: Annotated[list[str], typer.Argument(help="The complete new permission set.")],
    as_json: JsonOption = False,
) -> None:
    """Replace a role's permissions, bump its version, notify its users inline or via the fan-out queue."""
    with container_from_env() as container:
        change = identity.set_role_permissions(
            container.transactions,
            identity.Context.fresh(),
            role_id=role_id,
            permissions=codes,
            policy=container.fanout_policy,
        )
        log.info(
            "admin-action",
            action="set-role-permissions",
            role_id=str(role_id),
            role_version=change.role_version,
            who=operator(),
        )
        emit(
            {
                "roleId": change.role_id,
                "roleVersion": change.role_version,
                "path": change.path.value,
                "usersNotifiedInline": change.users_notified_inline,
                "taskId": change.task_id,
            },
            as_json,
        )


@fanout_app.command("list")
def fanout_list(
    status: Annotated[
        FanOutTaskStatus | None, typer.Option("--status", help="Only tasks in this status.")
    ] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=10_000)] = 100,
    as_json: JsonOption = False,
) -> None:
    """The newest fan-out tasks first."""
    with container_from_env() as container:
        tasks = container.fanout_queue.list_tasks(status.value if status else None, limit)
    if as_json:
        typer.echo(json.dumps(tasks, default=str))
        return
    table = Table("id", "role", "version", "status", "processed", "attempts", "created", "last error")
    for task in tasks:
        table.add_row(
            str(task["id"]),
            str(task["role_id"]),
            str(task["role_version"]),
            task["status"],
            str(task["processed_count"]),
            str(task["attempt_count"]),
            f"{task['created_at']:%Y-%m-%d %H:%M:%S}",
            task["last_error"] or "",
        )
    Console().print(table)


@fanout_app.command("replay")
def fanout_replay(task_id: Annotated[UUID, typer.Argument(help="A Failed task.")]) -> None:
    """Runbook: after fixing the cause, a Failed task goes back to Pending (AttemptCount = 0)."""
    with container_from_env() as container:
        container.fanout_queue.replay(task_id, now_utc())
        log.info("admin-action", action="fanout-replay", task_id=str(task_id), who=operator())
    typer.echo(f"task {task_id} is Pending again")


_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86_400}


def _duration(text: str) -> timedelta:
    """`90d`, `12h`, `30m`, `3600s`."""
    unit = _DURATION_UNITS.get(text[-1:].lower())
    if unit is None or not text[:-1].isdigit():
        raise typer.BadParameter(
            f"{text!r} is not a duration like 30d, 12h, 45m or 90s", param_hint="--older-than"
        )
    return timedelta(seconds=int(text[:-1]) * unit)


@maintenance_app.command("prune")
def maintenance_prune(
    older_than: Annotated[str, typer.Option("--older-than", help="Age cutoff: 30d, 12h, 45m, 90s.")],
    as_json: JsonOption = False,
) -> None:
    """Delete Completed/Failed fan-out tasks, finished import runs with their pages, and quarantine payloads
    older than the cutoff (PII retention)."""
    age = _duration(older_than)
    with container_from_env() as container:
        pruned = retention.prune(container.database, now_utc() - age)
        log.info("admin-action", action="maintenance-prune", older_than=older_than, who=operator(), **pruned)
    emit(pruned, as_json)


@app.command("worker")
def worker(
    jobs: Annotated[
        str,
        typer.Option("--jobs", help=f"Comma-separated: {', '.join(worker_entry.ALL_JOBS)} (default all)."),
    ] = ",".join(worker_entry.ALL_JOBS),
    once: Annotated[bool, typer.Option("--once", help="Work until nothing is pending, then exit 0.")] = False,
) -> None:
    """Run background jobs until SIGTERM/SIGINT."""
    chosen = [name.strip() for name in jobs.split(",") if name.strip()]
    unknown = [name for name in chosen if name not in worker_entry.ALL_JOBS]
    if unknown or not chosen:
        raise typer.BadParameter(
            f"unknown job {', '.join(unknown) or '(none)'}; choose from {', '.join(worker_entry.ALL_JOBS)}",
            param_hint="--jobs",
        )
    with container_from_env() as container:
        raise typer.Exit(worker_entry.run_worker(container, chosen, once=once))


@app.command("serve")
def serve(
    host: Annotated[str, typer.Option("--host", help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=1, max=65535, help="Port to listen on.")] = 8080,
) -> None:
    """The platform-admin HTTP API (needs PIN_IDENTITY_ADMIN_TOKEN) with /metrics, /healthz and /readyz."""
    from pin_identity.entrypoints.admin_http import serve_admin_api  # FastAPI only for this command

    with container_from_env() as container:
        serve_admin_api(container, host=host, port=port)


@app.command("demo")
def demo(
    companies: Annotated[
        int, typer.Option("--companies", min=1, max=100_000, help="Talent companies to bootstrap.")
    ] = 2_000,
    users: Annotated[
        int,
        typer.Option(
            "--users", min=201, max=1_000_000, help="Talent managers to bootstrap (the large role)."
        ),
    ] = 50_000,
    keep_running: Annotated[
        bool, typer.Option("--keep-running", help="Leave the embedded servers running afterwards.")
    ] = False,
    verbose: Annotated[bool, typer.Option("--verbose", help="Show the jobs' log lines too.")] = False,
) -> None:
    """The whole system on the embedded PostgreSQL and broker and a simulated Talent: bootstrap, then a
    large-role fan-out, with checks and a summary."""
    from pin_identity.entrypoints.demo import print_report, run_demo

    console = Console()
    with container_from_env() as container:
        container.require_broker()
        if not verbose:  # the progress bars and the summary say it; per-page log lines would drown them
            configure_logging(container.settings.log_format, level=logging.WARNING)
        report = run_demo(container, companies=companies, managers=users, console=console)
        embedded = container.settings.database_url is None and container.kafka_is_embedded
    print_report(report, console)
    if embedded and not keep_running:
        embedded_stop()
    raise typer.Exit(EXIT_OK if report.passed else EXIT_FAILED)


@embedded_app.command("stop")
def embedded_stop() -> None:
    """Stop the embedded PostgreSQL and broker started under PIN_IDENTITY_DATA_DIR."""
    from pin_identity.adapters.kafka.embedded import stop_embedded_kafka
    from pin_identity.adapters.postgres.embedded import stop_embedded_postgres

    settings: Settings = load_settings()
    kafka = stop_embedded_kafka(settings.data_dir)
    postgres = stop_embedded_postgres(settings.data_dir)
    typer.echo(
        f"broker {'stopped' if kafka else 'was not running'}; "
        f"postgres {'stopped' if postgres else 'was not running'}"
    )


def main(argv: list[str] | None = None) -> int:  # noqa: PLR0911 - one exit status per failure kind
    """Run the CLI; every failure is one line on stderr and a contract exit status, never a traceback."""
    try:
        result = app(args=argv, standalone_mode=False)
        return int(result) if isinstance(result, int) else EXIT_OK
    except typer.Exit as done:
        return int(done.exit_code)
    except typer.Abort:
        typer.echo("error: aborted", err=True)
        return EXIT_FAILED
    except typer.TyperException as exc:  # usage errors: unknown option, bad value, missing argument
        message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
        if message:  # empty when the help text was already shown (no arguments at all)
            typer.echo(f"error: {message}", err=True)
        return EXIT_BAD_INPUT
    except ConfigurationError as exc:
        typer.echo(f"error: {exc}", err=True)
        return EXIT_BAD_INPUT
    except IdentityError as exc:
        typer.echo(f"error: {exc.code}: {exc}", err=True)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        return _unexpected(exc)


def _unexpected(exc: Exception) -> int:
    """The last resort, still one line: the database or the broker failing names its variable (exit 2);
    anything else is a bug and says so (exit 1), its traceback only on request."""
    named = dependency_error(exc)
    if named is not None:
        typer.echo(f"error: {named}", err=True)
        return EXIT_BAD_INPUT
    typer.echo(f"error: {describe_error(exc)}", err=True)
    if _wants_traceback():
        traceback.print_exception(exc)
    return EXIT_FAILED


def _wants_traceback() -> bool:
    """PIN_IDENTITY_DEBUG with PIN_IDENTITY_LOG_FORMAT=console: a developer at a terminal, never a pod whose
    log lines are parsed one per event."""
    try:
        settings = load_settings()
    except ConfigurationError:
        return False
    return settings.debug and settings.log_format == "console"


def run() -> None:
    sys.exit(main())


if __name__ == "__main__":
    run()
