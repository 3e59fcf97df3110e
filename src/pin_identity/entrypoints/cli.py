"""`pin-identity`: the command line of CONTRACTS section 2, the one launcher of every entry point (the
command groups, `worker`, `serve`, `demo`). Commands parse input, call one use case, render its answer; every
failure is one line on stderr and a contract exit status."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Sequence
from typing import Annotated

import typer
from rich.console import Console

from pin_identity import __version__
from pin_identity.composition import privileges
from pin_identity.composition.embedded_servers import stop_embedded_servers
from pin_identity.composition.privileges import DATABASE_JOBS, KAFKA_JOBS
from pin_identity.config import Settings, load_settings
from pin_identity.entrypoints import cli_output as out
from pin_identity.entrypoints import worker as worker_entry
from pin_identity.entrypoints.access_cli import access_app
from pin_identity.entrypoints.cli_common import (
    EXIT_BAD_INPUT,
    EXIT_FAILED,
    EXIT_OK,
    JsonOption,
    command_group,
    container_from_env,
    fail,
)
from pin_identity.entrypoints.demo_console import print_console, start_console, stop_console
from pin_identity.entrypoints.documents import TopicsEnsured
from pin_identity.entrypoints.embedded_cli import embedded_fetch, embedded_info
from pin_identity.entrypoints.operator_cli import fanout_app, maintenance_app, roles_app
from pin_identity.entrypoints.talent_import_cli import run_initial_import, talent_import_app
from pin_identity.observability.logging import configure_logging

app = typer.Typer(
    name="pin-identity",
    help="Background jobs of the identity service.",
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # click's help layout, as in every group (cli_common.command_group)
)
db_app = command_group("Database schema.")
kafka_app = command_group("Kafka topics.")
embedded_app = command_group("The embedded PostgreSQL and broker used when no URL is configured.")
app.add_typer(db_app, name="db")
app.add_typer(kafka_app, name="kafka")
app.add_typer(roles_app, name="roles")
app.add_typer(fanout_app, name="fanout")
app.add_typer(embedded_app, name="embedded")
embedded_app.command("info")(embedded_info)
embedded_app.command("fetch")(embedded_fetch)
app.add_typer(maintenance_app, name="maintenance")
app.add_typer(talent_import_app, name="talent-import")
app.add_typer(access_app, name="access")


def _print_version(wanted: bool) -> None:
    if wanted:
        typer.echo(f"pin-identity {__version__}")
        raise typer.Exit(EXIT_OK)


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
    _version: Annotated[
        bool,
        typer.Option("--version", is_eager=True, callback=_print_version, help="Print the version and exit."),
    ] = False,
) -> None:
    if initial_import:
        raise typer.Exit(run_initial_import())
    if ctx.invoked_subcommand is None:
        typer.echo(ctx.get_help())
        raise typer.Exit(EXIT_BAD_INPUT)


@db_app.command("upgrade")
def db_upgrade() -> None:
    """Apply schema migrations (idempotent; safe when several pods run it at once)."""
    with container_from_env() as container:
        container.connections.upgrade_schema()
        typer.echo("schema is up to date")


@kafka_app.command("ensure-topics")
def kafka_ensure_topics(as_json: JsonOption = False) -> None:
    """Create missing pin.identity.* topics (compacted), and raise the largest event an existing one takes
    (max.message.bytes) to what a heavy user's access snapshot needs."""
    with container_from_env() as container:
        container.connections.require_broker()
        created = container.connections.ensure_topics()
        raised = container.connections.raise_message_limits()
    if as_json:
        out.print_json(TopicsEnsured(created=created, raised=raised))
        return
    typer.echo(f"created {', '.join(created)}" if created else "every topic exists")
    if raised:
        typer.echo(f"raised max.message.bytes of {', '.join(raised)}")


@kafka_app.command("acls")
def kafka_acls(
    principals: Annotated[
        list[str] | None,
        typer.Option(
            "--principal",
            metavar="JOB=PRINCIPAL",
            help=f"JOB=PRINCIPAL, e.g. outbox-relay=User:relay-prod (jobs: {', '.join(KAFKA_JOBS)}); "
            "default User:pin-identity-JOB.",
        ),
    ] = None,
) -> None:
    """Print the kafka-acls.sh commands that grant each job exactly what it uses, and nothing more."""
    chosen = _per_job(principals, KAFKA_JOBS, "--principal", "User:NAME", _is_kafka_principal)
    with container_from_env() as container:
        typer.echo("\n".join(privileges.kafka_acl_script(container.settings, chosen)))


def _per_job(
    pairs: list[str] | None, jobs: Sequence[str], option: str, shape: str, valid: Callable[[str], bool]
) -> dict[str, str]:
    """JOB=VALUE options as a mapping; a pair of an unknown job or an invalid value is a usage error."""
    chosen: dict[str, str] = {}
    for pair in pairs or []:
        job, _, value = pair.partition("=")
        if job not in jobs or not valid(value):
            expected = f"JOB={shape} with JOB one of {', '.join(jobs)}"
            raise typer.BadParameter(f"{pair!r} is not {expected}", param_hint=option)
        chosen[job] = value
    return chosen


def _is_kafka_principal(name: str) -> bool:
    return name.startswith("User:") and len(name) > len("User:")


@db_app.command("grants")
def db_grants(
    roles: Annotated[
        list[str] | None,
        typer.Option(
            "--role",
            metavar="JOB=ROLE",
            help=f"JOB=ROLE, e.g. outbox-relay=relay_prod (jobs: {', '.join(DATABASE_JOBS)}); "
            "default pin_identity_JOB.",
        ),
    ] = None,
    administrator: Annotated[
        bool,
        typer.Option(
            "--administrator",
            help="The administrator's part, run once: login roles, the writers' timeout, pg_read_all_stats.",
        ),
    ] = False,
    apply: Annotated[
        bool, typer.Option("--apply", help="Run it on the database instead of printing it.")
    ] = False,
) -> None:
    """Print (or apply) the SQL that gives each job's database role exactly what it uses: by default the
    schema owner's part, to apply after every `db upgrade`."""
    chosen = _per_job(roles, DATABASE_JOBS, "--role", "ROLE", lambda name: name.isidentifier())
    with container_from_env() as container:
        if not apply:
            script = privileges.database_grant_script(container.settings, chosen, administrator=administrator)
            typer.echo("\n".join(f"{statement};" for statement in script))
            return
        applied = privileges.apply_database_grants(container.connections, chosen, administrator=administrator)
    for statement in applied.existing_roles:
        typer.echo(f"kept: {statement} (the role exists)")
    typer.echo(f"applied {applied.statements} statements")


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
        bool,
        typer.Option(
            "--keep-running",
            help="Leave the embedded servers running afterwards, with `serve` and its console (/ui/).",
        ),
    ] = False,
    verbose: Annotated[bool, typer.Option("--verbose", help="Show the jobs' log lines too.")] = False,
) -> None:
    """The whole system on the embedded PostgreSQL and broker and a simulated Talent: bootstrap, then a
    large-role fan-out, with checks and a summary."""
    from pin_identity.entrypoints.demo import print_report, run_demo

    console = Console()
    with container_from_env() as container:
        container.connections.require_broker()
        if not verbose:  # the progress bars and the summary say it; per-page log lines would drown them
            configure_logging(container.settings.log_format, level=logging.WARNING)
        report = run_demo(container, companies=companies, managers=users, console=console)
        embedded = container.settings.database_url is None and container.connections.kafka_is_embedded
    print_report(report, console)
    if keep_running:
        print_console(start_console(container.settings, container.clock), console)
    elif embedded:
        embedded_stop()
    raise typer.Exit(EXIT_OK if report.passed else EXIT_FAILED)


@embedded_app.command("stop")
def embedded_stop() -> None:
    """Stop the embedded PostgreSQL and broker started under PIN_IDENTITY_DATA_DIR (and the console a
    `demo --keep-running` left)."""
    settings: Settings = load_settings()
    if stop_console(settings.data_dir):
        typer.echo("console (serve) stopped")
    kafka, postgres = stop_embedded_servers(settings.data_dir)
    typer.echo(
        f"broker {'stopped' if kafka else 'was not running'}; "
        f"postgres {'stopped' if postgres else 'was not running'}"
    )


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; every failure is one line on stderr and a contract exit status (cli_common's table)."""
    try:
        result = app(args=argv, standalone_mode=False)
        return int(result) if isinstance(result, int) else EXIT_OK
    except typer.Exit as done:
        return int(done.exit_code)
    except (Exception, KeyboardInterrupt) as exc:
        return fail(exc)


def run() -> None:
    sys.exit(main())


if __name__ == "__main__":
    run()
