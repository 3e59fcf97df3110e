"""`pin-identity`: the command line of CONTRACTS section 2. Commands parse input, call one use case."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, Any
from uuid import UUID

import typer

from pin_identity.composition import Container
from pin_identity.config import ConfigurationError, Settings, load_settings
from pin_identity.domain.errors import IdentityError
from pin_identity.entrypoints import worker as worker_entry
from pin_identity.observability.logging import configure_logging
from pin_identity.operations import identity

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2

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
embedded_app = typer.Typer(help="The embedded PostgreSQL and broker used when no URL is configured.")
app.add_typer(db_app, name="db")
app.add_typer(kafka_app, name="kafka")
app.add_typer(roles_app, name="roles")
app.add_typer(embedded_app, name="embedded")

JsonOption = Annotated[bool, typer.Option("--json", help="Machine-readable output on stdout.")]


@contextmanager
def _container() -> Iterator[Container]:
    settings = load_settings()
    configure_logging(settings.log_format)
    container = Container(settings)
    try:
        yield container
    finally:
        container.close()


def _emit(result: dict[str, Any], as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps(result, default=str))
    else:
        for key, value in result.items():
            typer.echo(f"{key}: {value}")


@db_app.command("upgrade")
def db_upgrade() -> None:
    """Apply schema migrations (idempotent; safe when several pods run it at once)."""
    with _container() as container:
        container.upgrade_schema()
        typer.echo("schema is up to date")


@kafka_app.command("ensure-topics")
def kafka_ensure_topics(as_json: JsonOption = False) -> None:
    """Create missing pin.identity.* topics (compacted)."""
    with _container() as container:
        created = container.ensure_topics()
        _emit({"created": created}, as_json)


@roles_app.command("set-permissions")
def roles_set_permissions(
    role_id: Annotated[UUID, typer.Argument(help="The role whose permission set is replaced.")],
    codes: Annotated[list[str], typer.Argument(help="The complete new permission set.")],
    as_json: JsonOption = False,
) -> None:
    """Replace a role's permissions, bump its version, notify its users inline or via the fan-out queue."""
    with _container() as container:
        change = identity.set_role_permissions(
            container.transactions,
            identity.Context.fresh(),
            role_id=role_id,
            permissions=codes,
            policy=container.fanout_policy,
        )
        _emit(
            {
                "roleId": change.role_id,
                "roleVersion": change.role_version,
                "path": change.path.value,
                "usersNotifiedInline": change.users_notified_inline,
                "taskId": change.task_id,
            },
            as_json,
        )


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
    with _container() as container:
        raise typer.Exit(worker_entry.run_worker(container, chosen, once=once))


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


def run() -> None:
    sys.exit(main())


if __name__ == "__main__":
    run()
