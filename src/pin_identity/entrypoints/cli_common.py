"""What every command shares: the container built from the environment, output, the audit's operator."""

from __future__ import annotations

import getpass
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, Any

import typer

from pin_identity.composition import Container
from pin_identity.config import ConfigurationError, load_settings
from pin_identity.observability.logging import configure_logging
from pin_identity.observability.tracing import configure_tracing

JsonOption = Annotated[bool, typer.Option("--json", help="Machine-readable output on stdout.")]


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


def operator() -> str:
    """Who ran an admin command, for the audit line."""
    try:
        return f"cli:{getpass.getuser()}"
    except (OSError, KeyError):  # a container user without a passwd entry
        return "cli:unknown"


def emit(result: dict[str, Any], as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps(result, default=str))
    else:
        for key, value in result.items():
            typer.echo(f"{key}: {value}")
