"""Structured logs: JSON off a terminal, readable lines on one; every line has a stable `event` name."""

from __future__ import annotations

import logging
import re
import sys
import traceback
from collections.abc import MutableMapping
from typing import Any, Literal

import structlog

from pin_identity.domain.phone import mask_phone

LogFormat = Literal["console", "json"]
# An operator action's audit line: written whatever the level (a terminal's quieter output keeps it).
AUDIT_EVENT = "admin-action"
_LEVELS = {"debug": 10, "info": 20, "warning": 30, "warn": 30, "error": 40, "exception": 40, "critical": 50}


def configure_logging(log_format: LogFormat | None = None, *, level: int = logging.INFO) -> None:
    """JSON off a terminal, readable lines on one (unless `log_format` says); lines under `level` are
    dropped, except audit lines."""
    chosen = log_format or ("console" if sys.stderr.isatty() else "json")
    renderer: Any = (
        structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
        if chosen == "console"
        else structlog.processors.JSONRenderer()
    )
    structlog.configure(
        processors=[
            _below(level),
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            render_exception_without_values,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(min(level, logging.INFO)),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
    # Libraries log through the standard module; keep them quiet unless something is wrong.
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s %(message)s")


def _below(level: int) -> Any:
    def drop_below_level(_logger: Any, method: str, event: MutableMapping[str, Any]) -> Any:
        if _LEVELS.get(method, logging.INFO) < level and event.get("event") != AUDIT_EVENT:
            raise structlog.DropEvent
        return event

    return drop_below_level


def get_logger(component: str) -> Any:
    return structlog.get_logger(component=component)


# A run of 10+ digits with separators between (not a date, not the tail of an id such as a UUID's last
# group): any written phone, and tax ids, no safer. E-mails with any letters in their top-level domain.
_DIGIT_RUN = re.compile(r"(?<![0-9A-Za-z-])(?!\d{4}-\d\d-\d\d)\+?\d(?:[ ()-]{0,2}\d){9,}")
_EMAIL = re.compile(r"[^\s@\"'<>(),;:]+@[^\s@\"'<>(),;:]+\.[^\W\d_]{2,}")


def describe_error(exc: BaseException, *, limit: int = 300) -> str:
    """An exception for a log line or an error column: its class and first line only, at most `limit`
    characters. A database error's detail lines quote the row it refused (phones, names), so they are dropped;
    a first line may still quote a value (`invalid input syntax ...: "<value>"`, a trigger's message), so
    phones there are masked and e-mails replaced."""
    if not str(exc).strip():
        return type(exc).__name__
    return f"{type(exc).__name__}: {scrub_contacts(first_line(exc))}"[:limit]


def first_line(exc: BaseException, text: str | None = None) -> str:
    """The first line of what an exception says (`text`, else its message), or its class name when it says
    nothing. Only the first: a driver's or a library's further lines may quote row values (PII)."""
    said = (str(exc) if text is None else text).strip()
    return said.splitlines()[0] if said else type(exc).__name__


def scrub_contacts(text: str) -> str:
    masked = _DIGIT_RUN.sub(lambda run: mask_phone(re.sub(r"\D", "", run.group())), text)
    return _EMAIL.sub("<e-mail>", masked)


def render_exception_without_values(
    _logger: Any, _method: str, event: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """`log.exception(...)`: the traceback's frames, and each exception of the chain as `describe_error` puts
    it. The standard rendering prints whole messages, whose detail lines quote the refused row."""
    exc = _exception_of(event.pop("exc_info", None))
    if exc is not None:
        event["exception"] = "".join(_traceback_lines(exc))
    return event


def _exception_of(exc_info: Any) -> BaseException | None:
    if isinstance(exc_info, BaseException):
        return exc_info
    if isinstance(exc_info, tuple):
        return exc_info[1] if isinstance(exc_info[1], BaseException) else None
    return sys.exc_info()[1] if exc_info else None


def _traceback_lines(exc: BaseException) -> list[str]:
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in chain:
        chain.append(current)
        current = current.__cause__ or (None if current.__suppress_context__ else current.__context__)
    lines: list[str] = []
    for link in reversed(chain):
        lines.append("Traceback (most recent call last):\n")
        lines.extend(traceback.format_tb(link.__traceback__))
        lines.append(describe_error(link, limit=1000) + "\n")
    return lines
