"""What every command shares: its group, the container built from the environment, the audit's operator, and
the one table that turns a failure into an exit status and one line on stderr."""

from __future__ import annotations

import getpass
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Annotated

import typer

from pin_identity.composition import Container
from pin_identity.composition.failures import dependency_error
from pin_identity.config import ConfigurationError, load_settings
from pin_identity.domain.errors import (
    BrokerUnavailableError,
    IdentityError,
    ServiceError,
    SourceNotConfiguredError,
)
from pin_identity.domain.import_run import (
    ImportAlreadyRunningError,
    ImportSourceIncompleteError,
    ImportSourceUnavailableError,
)
from pin_identity.observability.logging import configure_logging, describe_error
from pin_identity.observability.tracing import configure_tracing
from pin_identity.operations.action_log import Actor

# CONTRACTS section 2.
EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_ALREADY_RUNNING, EXIT_SOURCE_UNAVAILABLE, EXIT_CANCELLED = range(6)
EXIT_INTERRUPTED = 130
# Stopped by SIGTERM (the shell's 128 + 15): what was running is left for the next process to resume.
EXIT_STOPPED = 143

JsonOption = Annotated[
    bool, typer.Option("--json", help="JSON on stdout, in the HTTP API's shapes (camelCase, ISO-8601).")
]


def command_group(help_text: str) -> typer.Typer:
    """A group of commands; named alone, it prints its help (exit 2). Help is click's plain layout: it prints
    a flag as `--dry-run` and a choice with its values (`--mode <api-pull|topic-replay>`), where Typer's rich
    panels print every flag as `--dry-run <bool>`."""
    group = typer.Typer(help=help_text, invoke_without_command=True, rich_markup_mode=None)
    group.callback()(_help_without_command)
    return group


def _help_without_command(ctx: typer.Context) -> None:
    if ctx.invoked_subcommand is None:
        typer.echo(ctx.get_help())
        raise typer.Exit(EXIT_BAD_INPUT)


@contextmanager
def container_from_env() -> Iterator[Container]:
    settings = load_settings()
    configure_logging(settings.log_format)
    try:
        configure_tracing()
    except ValueError as exc:
        raise ConfigurationError(str(exc)) from None
    container = Container(settings)
    # At start for every command, like every other variable: not when a job thread first builds a Kafka client
    # and dies of it with a traceback.
    container.connections.check_kafka_config()
    try:
        yield container
    finally:
        container.close()


def operator() -> Actor:
    """Who ran an admin command, for the audit line: the OS user."""
    try:
        return Actor(f"cli:{getpass.getuser()}")
    except (OSError, KeyError):  # a container user without a passwd entry
        return Actor("cli:unknown")


# ---------------------------------------------------------------- failures: exit status and one line


def _with_code(exc: BaseException) -> str:
    return f"{exc.code}: {exc}" if isinstance(exc, ServiceError) else str(exc)


def _usage(exc: BaseException) -> str:
    format_message = getattr(exc, "format_message", None)
    return str(format_message()) if callable(format_message) else str(exc)


# Every failure a command ends with, most specific kind first: the first kind the error is decides its exit
# status and its line on stderr (None: no line). A refusal names its code; a configuration line names its
# variable instead.
_FAILURES: tuple[tuple[type[BaseException], int, Callable[[BaseException], str] | None], ...] = (
    (ImportAlreadyRunningError, EXIT_ALREADY_RUNNING, _with_code),
    (ImportSourceUnavailableError, EXIT_SOURCE_UNAVAILABLE, _with_code),
    (ImportSourceIncompleteError, EXIT_SOURCE_UNAVAILABLE, _with_code),
    (IdentityError, EXIT_BAD_INPUT, _with_code),  # bad input, an unknown id, a conflicting state
    (ConfigurationError, EXIT_BAD_INPUT, str),
    (BrokerUnavailableError, EXIT_BAD_INPUT, str),  # a line naming the variable to check
    (SourceNotConfiguredError, EXIT_BAD_INPUT, str),  # e.g. api-pull without PIN_IDENTITY_TALENT_API_URL
    (typer.TyperException, EXIT_BAD_INPUT, _usage),  # unknown option, bad value, missing argument
    (typer.Abort, EXIT_FAILED, lambda _: "aborted"),
    (KeyboardInterrupt, EXIT_INTERRUPTED, None),
)


def exit_status(exc: BaseException) -> int:
    """The exit status a command ends with when it raises `exc`."""
    known = _known(exc)
    return known[0] if known else EXIT_FAILED


def fail(exc: BaseException) -> int:
    """Say the failure in one line on stderr and return its exit status. A failure outside the table is a
    bug and says so (exit 1), its traceback only when a developer asks for one."""
    known = _known(exc)
    status, line = known or (EXIT_FAILED, describe_error(exc))
    if line is not None:
        typer.echo(f"error: {line}", err=True)
    if known is None and _wants_traceback():
        traceback.print_exception(exc)
    return status


def _known(exc: BaseException) -> tuple[int, str | None] | None:
    """The table's exit status and line; else the database or the broker failing unexpectedly, said as the
    variable to check (exit 2); else None."""
    for kind, status, line in _FAILURES:
        if isinstance(exc, kind):
            return status, line(exc) if line else None
    named = dependency_error(exc)
    return (EXIT_BAD_INPUT, str(named)) if named is not None else None


def _wants_traceback() -> bool:
    """PIN_IDENTITY_DEBUG with PIN_IDENTITY_LOG_FORMAT=console: a developer at a terminal, never a pod whose
    log lines are parsed one per event."""
    try:
        settings = load_settings()
    except ConfigurationError:
        return False
    return settings.debug and settings.log_format == "console"
