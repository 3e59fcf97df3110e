"""Structured logs: JSON off a terminal, readable lines on one; every line has a stable `event` name."""

from __future__ import annotations

import logging
import sys
from typing import Any, Literal

import structlog

LogFormat = Literal["console", "json"]


def configure_logging(log_format: LogFormat | None = None, *, level: int = logging.INFO) -> None:
    chosen = log_format or ("console" if sys.stderr.isatty() else "json")
    renderer: Any = (
        structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
        if chosen == "console"
        else structlog.processors.JSONRenderer()
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
    # Libraries log through the standard module; keep them quiet unless something is wrong.
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s %(message)s")


def get_logger(component: str) -> Any:
    return structlog.get_logger(component=component)


def describe_error(exc: BaseException, *, limit: int = 300) -> str:
    """An exception for a log line or an error column: its class and first line only, at most `limit`
    characters. A database error's detail lines quote the row it refused (phones, names): no PII goes out."""
    first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {first_line}"[:limit] if first_line else type(exc).__name__
