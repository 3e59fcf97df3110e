"""Structured logs: JSON off a terminal, readable lines on one; every line has a stable `event` name.

The libraries' lines (psycopg and its pool, uvicorn, alembic, httpx, librdkafka through the Kafka clients'
`logger`) come through the standard `logging` module: they are rendered by the same renderer, as
`library-log` lines naming their `logger`, so that a log shipper reading stderr line by line never meets a
plain-text or multi-line fragment."""

from __future__ import annotations

import logging
import re
import sys
import traceback
from collections.abc import Mapping, MutableMapping
from typing import Any, Literal

import structlog

from pin_identity.domain.phone import mask_phone

LogFormat = Literal["console", "json"]
# An operator action's audit line: written whatever the level (a terminal's quieter output keeps it).
AUDIT_EVENT = "admin-action"
_LEVELS = {"debug": 10, "info": 20, "warning": 30, "warn": 30, "error": 40, "exception": 40, "critical": 50}
LIBRARY_EVENT = "library-log"
# Below WARNING the libraries write a line per connection handed out (psycopg.pool), per request (httpx,
# uvicorn's startup banner), per migration step (alembic: `db upgrade` says the outcome itself) or per
# broker state change (librdkafka): chatter that would bury the jobs' lines. From WARNING up they say what
# went wrong: a connection lost or refused, a broker down, an application error.
LIBRARY_LEVEL = logging.WARNING


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
        processors=[_below(level), *_every_line(), renderer],
        wrapper_class=structlog.make_filtering_bound_logger(min(level, logging.INFO)),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
    _route_library_logs(renderer, max(level, LIBRARY_LEVEL))


def _every_line() -> list[Any]:
    """What every line gets, ours and the libraries': the context, the level, the time, a traceback without
    the values it would quote."""
    return [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        render_exception_without_values,
    ]


def _route_library_logs(renderer: Any, level: int) -> None:
    """The standard logging's root handler renders through `renderer`; called again (another format, a
    progress bar's console), it replaces the handler it installed before."""
    handler = _StandardErrorHandler()
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[_library_line, *_every_line()],
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
            use_get_message=False,  # the message is formatted by `_library_line`, its exceptions described
            pass_foreign_args=True,
        )
    )
    root = logging.getLogger()
    for installed in [h for h in root.handlers if isinstance(h, _StandardErrorHandler)]:
        root.removeHandler(installed)
    root.addHandler(handler)
    root.setLevel(level)
    logging.captureWarnings(True)  # a library's `warnings.warn` too: not printed raw over two lines


class _StandardErrorHandler(logging.StreamHandler[Any]):
    """Writes to whatever `sys.stderr` is when a line is logged: one swapped since (a progress bar's
    console, a test's capture) is never written to after it was closed."""

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, _stream: Any) -> None:
        return

    def emit(self, record: logging.LogRecord) -> None:
        """Through structlog's own writer for the stream, which holds that stream's lock for the whole line:
        a library's line and one of ours written at once by two threads stay two lines."""
        try:
            structlog.PrintLogger(self.stream).msg(self.format(record))
        except Exception:  # the logging module's rule: a failed line never raises
            self.handleError(record)


def _library_line(_logger: Any, _method: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """A standard `logging` record as a line of ours: a stable event name, the library (`component`, its
    top package) and its `logger`, and its message with any exception in it reduced to its first line and
    contacts masked, as `describe_error` does (a connection or query error's detail lines quote rows)."""
    record: logging.LogRecord = event["_record"]
    del event["event"]  # the record's unformatted message: formatted here, from the record
    message = _formatted(str(_described(record.msg)), event.pop("positional_args", ()))
    return {
        "component": record.name.partition(".")[0],
        "logger": record.name,
        "message": scrub_contacts(message).rstrip(),
        **event,
        "event": LIBRARY_EVENT,
    }


def _formatted(template: str, args: Any) -> str:
    """`template % args` as `logging` formats it, each exception among the args as its first line."""
    try:
        if isinstance(args, Mapping):
            return template % {name: _described(value) for name, value in args.items()}
        return template % tuple(_described(value) for value in args) if args else template
    except (TypeError, ValueError, KeyError):
        return template


def _described(value: Any) -> Any:
    return scrub_contacts(first_line(value)) if isinstance(value, BaseException) else value


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
