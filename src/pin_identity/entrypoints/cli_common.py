"""What every command shares: its group, the container built from the environment, the audit's operator."""

from __future__ import annotations

import getpass
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated

import typer

from pin_identity.composition import Container
from pin_identity.config import ConfigurationError, load_settings
from pin_identity.observability.logging import configure_logging
from pin_identity.observability.tracing import configure_tracing
from pin_identity.operations.audit import Actor

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
        raise typer.Exit(2)


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
    container.check_kafka_config()
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
