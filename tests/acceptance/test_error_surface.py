"""Every failure is one clear line (CONTRACTS section 2): each command, run as a process against an
unreachable database, an unreachable broker, Kafka properties librdkafka refuses and unknown ids, ends within
BOUND_S with its documented exit status and exactly one line on stderr naming the code or the variable, never
a traceback.

The cases of one table run in parallel threads: most of their time is a new interpreter importing the package.
"""

from __future__ import annotations

import socket
import subprocess
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field

import psycopg
import pytest
import sqlalchemy.exc
from confluent_kafka import KafkaError, KafkaException

from pin_identity.adapters.kafka.embedded_kafka import free_port
from pin_identity.adapters.system_clock import SYSTEM_CLOCK
from pin_identity.composition.stores import Stores
from pin_identity.domain.import_run import ImportMode, ImportRequest, RunEnding
from pin_identity.entrypoints import cli, operator_cli
from tests.support.cli import run_cli

BOUND_S = 15.0  # docs/operators.md, "Command line": every failure is reported within this
UNKNOWN = "00000000-0000-4000-8000-00000000dead"
NO_DATABASE = {"PIN_IDENTITY_DATABASE_URL": "postgresql://x@127.0.0.1:1/x"}
NO_BROKER = {"PIN_IDENTITY_KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:1"}
UNKNOWN_PROPERTY = {"PIN_IDENTITY_KAFKA_CONFIG": '{"no.such.property": "1"}'}
INVALID_VALUE = {"PIN_IDENTITY_KAFKA_CONFIG": '{"acks": "banana"}'}
# Valid alone, refused next to the relay's enable.idempotence=true: only building the producer finds it.
CONFLICTING = {"PIN_IDENTITY_KAFKA_CONFIG": '{"acks": "1"}'}
TOPIC_REPLAY_MODE = {"PIN_IDENTITY_TALENT_IMPORT_MODE": "topic-replay"}

DATABASE = "PIN_IDENTITY_DATABASE_URL"
BROKER = "PIN_IDENTITY_KAFKA_BOOTSTRAP_SERVERS"
KAFKA_CONFIG = "PIN_IDENTITY_KAFKA_CONFIG"
NOT_FOUND = "IDENTITY_NOT_FOUND"
SOURCE_UNAVAILABLE = "IDENTITY_IMPORT_SOURCE_UNAVAILABLE"


@dataclass(frozen=True)
class Case:
    args: tuple[str, ...]
    exit_status: int = 0
    names: tuple[str, ...] = ()  # what the one line on stderr must name (a variable, a code)
    env: Mapping[str, str] = field(default_factory=dict)


def every_command(*, serve_port: int) -> list[tuple[str, ...]]:
    """CONTRACTS section 2, one invocation each, with arguments that would otherwise be valid."""
    return [
        ("db", "upgrade"),
        ("kafka", "ensure-topics"),
        ("maintenance", "prune", "--older-than", "30d"),
        ("worker", "--once"),
        ("worker", "--jobs", "access-fanout", "--once"),
        ("roles", "set-permissions", UNKNOWN, "deals.read"),
        ("roles", "list"),
        ("roles", "show", UNKNOWN),
        ("fanout", "list"),
        ("fanout", "replay", UNKNOWN),
        ("fanout", "discard", UNKNOWN),
        ("talent-import", "run", "--mode", "api-pull"),
        ("talent-import", "run", "--mode", "topic-replay"),
        ("--run-initial-import",),
        ("talent-import", "status"),
        ("talent-import", "status", UNKNOWN),
        ("talent-import", "cancel", UNKNOWN),
        ("talent-import", "failed-items", UNKNOWN),
        ("talent-import", "reset-leases", UNKNOWN),
        ("talent-import", "replay-failed", UNKNOWN),
        ("access", "audit", "--json"),
        ("access", "show", UNKNOWN),
        ("serve", "--port", str(serve_port)),
        ("demo", "--companies", "1", "--users", "201"),
    ]


# The commands that need the broker to start. `serve` is not one: it starts without it and says so on /readyz.
BROKER_CASES = [
    Case(("kafka", "ensure-topics"), 2, (BROKER,)),
    Case(("access", "audit"), 2, (BROKER,)),
    Case(("worker", "--once"), 2, (BROKER,)),
    Case(("worker", "--jobs", "outbox-relay", "--once"), 2, (BROKER,)),
    Case(("worker", "--jobs", "talent-sync"), 2, (BROKER,)),
    # TopicReplay's source is the broker: unreachable, the source is unavailable (exit 4).
    Case(("talent-import", "run", "--mode", "topic-replay"), 4, (SOURCE_UNAVAILABLE, BROKER)),
    Case(("--run-initial-import",), 4, (SOURCE_UNAVAILABLE, BROKER), TOPIC_REPLAY_MODE),
    Case(("demo", "--companies", "1", "--users", "201"), 2, (BROKER,)),
]


def test_an_unreachable_database(subprocess_env: dict[str, str]) -> None:
    touch_no_database = {("kafka", "ensure-topics"), ("embedded", "stop"), ("--version",)}
    commands = [*every_command(serve_port=free_port()), ("embedded", "stop"), ("--version",)]
    cases = [Case(args, 0) if args in touch_no_database else Case(args, 2, (DATABASE,)) for args in commands]
    run_table({**subprocess_env, **NO_DATABASE, "PIN_IDENTITY_ADMIN_TOKEN": "t"}, cases)


def test_an_unreachable_broker(subprocess_env: dict[str, str]) -> None:
    run_table({**subprocess_env, **NO_BROKER}, BROKER_CASES)


def test_kafka_properties_librdkafka_refuses(subprocess_env: dict[str, str]) -> None:
    """Checked at start by every command that builds its container, like every other variable: here those
    that use the broker, `serve` (its /readyz does) and one that does not."""
    bad = [UNKNOWN_PROPERTY, INVALID_VALUE]
    others = [Case(("serve", "--port", str(free_port()))), Case(("fanout", "list"))]
    cases = [
        Case(case.args, 2, (KAFKA_CONFIG,), {**case.env, **bad[number % 2]})
        for number, case in enumerate([*BROKER_CASES, *others])
    ]
    cases.append(Case(("worker", "--jobs", "outbox-relay", "--once"), 2, (KAFKA_CONFIG, "acks"), CONFLICTING))
    run_table({**subprocess_env, "PIN_IDENTITY_ADMIN_TOKEN": "t"}, cases)


def test_unknown_ids(subprocess_env: dict[str, str], stores: Stores) -> None:
    store = stores.import_store
    finished = store.create_run(ImportRequest(ImportMode.API_PULL), uuid.uuid4(), SYSTEM_CLOCK.now())
    store.finish_run(finished.run_id, RunEnding.completed(), SYSTEM_CLOCK.now())
    run_id = str(finished.run_id)
    cases = [
        Case(("roles", "set-permissions", UNKNOWN, "deals.read"), 2, (NOT_FOUND, UNKNOWN)),
        Case(("roles", "show", UNKNOWN), 2, (NOT_FOUND, UNKNOWN)),
        Case(("access", "show", UNKNOWN), 2, (NOT_FOUND, UNKNOWN)),
        Case(("fanout", "replay", UNKNOWN), 2, (NOT_FOUND, UNKNOWN)),
        Case(("fanout", "discard", UNKNOWN), 2, (NOT_FOUND, UNKNOWN)),
        *(
            Case(("talent-import", command, UNKNOWN), 2, (NOT_FOUND, UNKNOWN))
            for command in ("status", "cancel", "failed-items", "reset-leases", "replay-failed")
        ),
        Case(("talent-import", "replay-failed", run_id, "--item", UNKNOWN), 2, (NOT_FOUND, UNKNOWN)),
        Case(("talent-import", "cancel", run_id), 2, ("IDENTITY_IMPORT_NOT_RUNNING", run_id)),
    ]
    run_table(subprocess_env, cases)


def test_no_import_run_yet_is_not_found(subprocess_env: dict[str, str]) -> None:
    run_table(subprocess_env, [Case(("talent-import", "status"), 2, (NOT_FOUND,))])


def test_a_port_another_process_holds(subprocess_env: dict[str, str]) -> None:
    with _held_port() as port:
        cases = [
            Case(
                ("worker", "--jobs", "access-fanout"),
                2,
                ("PIN_IDENTITY_WORKER_HTTP_PORT",),
                {"PIN_IDENTITY_WORKER_HTTP_PORT": str(port)},
            ),
            Case(("serve", "--port", str(port)), 2, ("--port",), {"PIN_IDENTITY_ADMIN_TOKEN": "t"}),
        ]
        run_table(subprocess_env, cases)


# ---------------------------------------------------------------- the last resort, in process


def _wrapped_by_sqlalchemy() -> Exception:
    """As Alembic's connection raises it: SQLAlchemy's error, from the driver's."""
    try:
        try:
            raise psycopg.OperationalError("connection failed")
        except psycopg.OperationalError as exc:
            raise sqlalchemy.exc.OperationalError("SELECT 1", {}, exc) from exc
    except sqlalchemy.exc.OperationalError as wrapped:
        return wrapped


@pytest.mark.parametrize(
    ("raised", "status", "line"),
    [
        (
            psycopg.OperationalError("connection failed: server closed the connection\nDETAIL: x"),
            2,
            f"error: {DATABASE}: database unreachable (connection failed: server closed the connection)",
        ),
        (_wrapped_by_sqlalchemy(), 2, f"error: {DATABASE}: database unreachable (connection failed)"),
        (KafkaException(KafkaError(KafkaError._TRANSPORT)), 2, f"error: {BROKER}: broker unreachable"),
        (
            KafkaException(KafkaError(KafkaError.SASL_AUTHENTICATION_FAILED)),
            2,
            f"error: {KAFKA_CONFIG}: the broker refused the client",
        ),
        (
            KafkaException(KafkaError(KafkaError.INVALID_REPLICATION_FACTOR)),
            2,
            "error: PIN_IDENTITY_KAFKA_REPLICATION_FACTOR: the broker refused it",
        ),
        # Neither is a configuration problem: a statement timeout and a bug keep exit 1, in one line.
        (
            psycopg.errors.QueryCanceled("canceling statement due to statement timeout"),
            1,
            "error: QueryCanceled: canceling statement due to statement timeout",
        ),
        (RuntimeError("boom\nsecond line"), 1, "error: RuntimeError: boom"),
    ],
)
def test_an_unexpected_error_is_one_line(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    raised: Exception,
    status: int,
    line: str,
) -> None:
    _command_raises(monkeypatch, raised)
    assert cli.main(["fanout", "list"]) == status
    stderr = capsys.readouterr().err.splitlines()
    assert len(stderr) == 1 and stderr[0].startswith(line), stderr


def test_the_traceback_of_a_bug_only_on_request(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _command_raises(monkeypatch, RuntimeError("boom"))
    monkeypatch.setenv("PIN_IDENTITY_DEBUG", "1")
    monkeypatch.setenv("PIN_IDENTITY_LOG_FORMAT", "json")
    assert cli.main(["fanout", "list"]) == 1
    assert "Traceback" not in capsys.readouterr().err
    monkeypatch.setenv("PIN_IDENTITY_LOG_FORMAT", "console")
    assert cli.main(["fanout", "list"]) == 1
    stderr = capsys.readouterr().err
    assert stderr.startswith("error: RuntimeError: boom\nTraceback")


# ---------------------------------------------------------------- helpers


def run_table(env: Mapping[str, str], cases: Sequence[Case]) -> None:
    with ThreadPoolExecutor(max_workers=4) as pool:
        problems = [p for p in pool.map(lambda case: _problem(env, case), cases) if p]
    assert not problems, f"{len(problems)} of {len(cases)} cases:\n" + "\n".join(problems)


def _problem(env: Mapping[str, str], case: Case) -> str | None:
    """What is wrong with the case's run, or None."""
    started = time.monotonic()
    try:
        result = run_cli({**env, **case.env}, *case.args, timeout=BOUND_S)
    except subprocess.TimeoutExpired:
        return f"{' '.join(case.args)}: still running after {BOUND_S:g} s"
    wrong = _mismatches(case, result, time.monotonic() - started)
    if not wrong:
        return None
    return f"{' '.join(case.args)}: {'; '.join(wrong)}\n    stderr: {result.stderr[-600:]!r}"


def _mismatches(case: Case, result: subprocess.CompletedProcess[str], seconds: float) -> list[str]:
    lines = result.stderr.strip().splitlines()
    wrong = []
    if result.returncode != case.exit_status:
        wrong.append(f"exit {result.returncode}, expected {case.exit_status}")
    if "Traceback" in result.stderr:
        wrong.append("a traceback")
    if case.exit_status and len(lines) != 1:
        wrong.append(f"{len(lines)} lines on stderr")
    elif case.exit_status and not lines[0].startswith("error: "):
        wrong.append("the line does not start with 'error: '")
    missing = [name for name in case.names if not lines or name not in lines[0]]
    if missing:
        wrong.append(f"the line does not name {', '.join(missing)}")
    if seconds > BOUND_S:
        wrong.append(f"took {seconds:.1f} s")
    return wrong


@contextmanager
def _held_port() -> Iterator[int]:
    """A port in use as another worker would hold it: listening on every address."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("0.0.0.0", 0))
        held.listen()
        yield int(held.getsockname()[1])


def _command_raises(monkeypatch: pytest.MonkeyPatch, raised: Exception) -> None:
    """`fanout list` (of operator_cli) fails as it builds its container."""

    def container_from_env() -> None:
        raise raised

    monkeypatch.setattr(operator_cli, "container_from_env", container_from_env)
