"""The operators of the admin API (admin_http.tokens): the tokens file's lines, white space around tokens, the
file read again on its own clock, and a file that cannot be used leaving the operators as they were."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import anyio
import pytest
from structlog.testing import capture_logs

from pin_identity.config import ConfigurationError
from pin_identity.entrypoints.admin_http.tokens import (
    Operators,
    OperatorsFileError,
    parse_operators,
    readers_besides_the_owner,
    token_digest,
)
from pin_identity.entrypoints.documents import AdminRole
from pin_identity.observability import metrics
from pin_identity.operations.action_log import Actor, admin_action
from tests.support.clocks import ManualClock
from tests.support.waiting import wait_until


def sha(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def line(name: str, role: str, token: str) -> str:
    return f"{name} {role} {sha(token)}\n"


@pytest.fixture
def tokens_file(tmp_path: Path) -> Path:
    path = tmp_path / "operators"
    path.write_text(line("alice", "operator", "alice-token") + line("bob", "viewer", "bob-token"))
    return path


def names(operators: Operators, *tokens: str) -> list[str | None]:
    return [(found.name if (found := operators.authenticate(token)) else None) for token in tokens]


# ---------------------------------------------------------------- the file's lines


def test_a_file_with_comments_blank_lines_and_any_white_space() -> None:
    text = (
        "# operators of the identity admin API\n"
        "\n"
        f"  alice\toperator   {sha('a')}   # on call\r\n"
        f"bob viewer {sha('b').upper()}\n"
        "   \n"
    )
    listed = parse_operators(text)
    assert [(o.name, o.role) for o in listed] == [("alice", AdminRole.OPERATOR), ("bob", AdminRole.VIEWER)]
    assert [o.digest for o in listed] == [token_digest("a"), token_digest("b")]


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        (f"alice operator\n{sha('a')}\n", "line 1: 2 fields, expected 3"),
        (f"alice operator {sha('a')} extra\n", "line 1: 4 fields, expected 3"),
        (f"alice admins {sha('a')}\n", "line 1: unknown role 'admins' (viewer or operator)"),
        (f"alice Viewer {sha('a')}\n", "line 1: unknown role 'Viewer'"),
        ("alice viewer a-token-not-its-digest\n", "line 1: the third field is not a sha256"),
        (f"alice viewer {sha('a')[:-1]}\n", "line 1: the third field is not a sha256"),
        (f"al/ice viewer {sha('a')}\n", "line 1: a name is 1 to 64 letters"),
        (f"-alice viewer {sha('a')}\n", "line 1: a name is 1 to 64 letters"),
        (f"alice viewer {sha('')}\n", "line 1: that is the sha256 of an empty token"),
        (
            line("alice", "viewer", "a") + "\n" + line("alice", "operator", "b"),
            "line 3: operator 'alice' is also line 1",
        ),
        (line("alice", "viewer", "a") + line("bob", "operator", "a"), "line 2: the same token as line 1"),
    ],
)
def test_a_line_the_file_cannot_have(text: str, reason: str) -> None:
    with pytest.raises(OperatorsFileError) as refused:
        parse_operators(text)
    assert str(refused.value).startswith(reason)
    assert sha("a") not in str(refused.value)


def test_the_admin_of_the_token_variable_is_not_named_again_nor_its_token_reused(tmp_path: Path) -> None:
    path = tmp_path / "operators"
    for content, reason in [
        (line("admin", "viewer", "other"), "line 1: operator 'admin' is also PIN_IDENTITY_ADMIN_TOKEN"),
        (line("carol", "viewer", "the-token"), "line 1: the same token as PIN_IDENTITY_ADMIN_TOKEN"),
    ]:
        path.write_text(content)
        with pytest.raises(ConfigurationError, match=reason):
            Operators("the-token", path, clock=ManualClock())


# ---------------------------------------------------------------- tokens and roles


def test_white_space_around_a_token_is_not_part_of_it(tokens_file: Path) -> None:
    operators = Operators("  admin-token\n", tokens_file, clock=ManualClock())
    assert names(operators, "admin-token", " admin-token ", "alice-token\n", "\tbob-token") == [
        "admin",
        "admin",
        "alice",
        "bob",
    ]
    assert names(operators, "", "admin", "alice-token2", "bob-token bob-token") == [None] * 4


def test_the_single_token_is_the_operator_admin() -> None:
    [admin] = Operators("t0ken", None, clock=ManualClock()).current()
    assert (admin.name, admin.role) == ("admin", AdminRole.OPERATOR)


@pytest.mark.parametrize(
    ("method", "viewer"),
    [("GET", True), ("HEAD", True), ("POST", False), ("PUT", False), ("DELETE", False), ("PATCH", False)],
)
def test_a_viewer_reads_and_an_operator_does_everything(method: str, viewer: bool) -> None:
    assert AdminRole.VIEWER.permits(method) is viewer
    assert AdminRole.OPERATOR.permits(method)


@pytest.mark.parametrize("token", [None, "", " \n"])
def test_no_operator_at_all_is_refused(token: str | None) -> None:
    with pytest.raises(
        ConfigurationError, match=r"^PIN_IDENTITY_ADMIN_TOKENS_FILE or PIN_IDENTITY_ADMIN_TOKEN: "
    ):
        Operators(token, None, clock=ManualClock())


def test_a_file_that_cannot_be_used_at_start_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match=r"^PIN_IDENTITY_ADMIN_TOKENS_FILE: cannot read .*missing"):
        Operators(None, tmp_path / "missing", clock=ManualClock())
    (tmp_path / "broken").write_text("alice operator\n")
    with pytest.raises(ConfigurationError, match=r"^PIN_IDENTITY_ADMIN_TOKENS_FILE: line 1: 2 fields"):
        Operators("t0ken", tmp_path / "broken", clock=ManualClock())


def test_an_empty_file_is_no_operator_yet() -> None:
    """A file with no line yet is valid: operators may be added later, without a restart."""
    operators = Operators(None, Path("/dev/null"), clock=ManualClock())
    assert operators.current() == () and operators.problem() is None


# ---------------------------------------------------------------- edits while serving


def test_an_edit_is_in_force_at_the_first_look_after_the_recheck_interval(tokens_file: Path) -> None:
    clock = ManualClock()
    operators = Operators(None, tokens_file, clock=clock, recheck_s=2.0)
    tokens_file.write_text(
        line("alice", "operator", "alice-rotated") + line("carol", "viewer", "carol-token")
    )
    clock.advance(1.9)
    assert names(operators, "alice-token", "bob-token", "alice-rotated") == ["alice", "bob", None]
    clock.advance(0.1)
    with capture_logs() as logs:
        assert names(operators, "alice-token", "bob-token", "alice-rotated", "carol-token") == [
            None,
            None,
            "alice",
            "carol",
        ]
    assert logs == [
        {
            "event": "admin-operators-reloaded",
            "component": "admin-http",
            "viewers": 1,
            "operators": 1,
            "log_level": "info",
        }
    ]


def load_error() -> float | None:
    return metrics.registry.get_sample_value("identity_admin_tokens_file_load_error")


def assert_no_secret_in(logs: list[dict[str, object]], *tokens: str) -> None:
    logged = str(logs)
    for token in tokens:
        assert token not in logged and sha(token) not in logged and sha(token).upper() not in logged


def test_a_broken_edit_keeps_only_the_operators_whose_line_is_unchanged(tmp_path: Path) -> None:
    """An edit that removes bob, promotes carol and adds dave, with a typo on another line: bob's removal
    must not wait for the typo's fix. Only alice, whose line is as it was, stays; admin is not the file's."""
    path = tmp_path / "operators"
    good = line("alice", "operator", "alice-token") + line("bob", "viewer", "bob-token")
    path.write_text(good + line("carol", "viewer", "carol-token"))
    clock = ManualClock()
    operators = Operators("admin-token", path, clock=clock)
    edited = (
        f"  alice   operator {sha('alice-token').upper()}  # re-spaced: the same line\n"
        + line("carol", "operator", "carol-token")
        + line("dave", "viewer", "dave-token")
        + f"erin operatr {sha('erin-token')}\n"
    )
    path.write_text(edited)
    clock.advance(2)
    tokens = ("admin-token", "alice-token", "bob-token", "carol-token", "dave-token", "erin-token")
    with capture_logs() as logs:
        assert names(operators, *tokens) == ["admin", "alice", None, None, None, None]
        assert operators.problem() == (
            "PIN_IDENTITY_ADMIN_TOKENS_FILE: line 4: unknown role 'operatr' (viewer or operator); "
            "only the operators whose line is unchanged stay in force"
        )
        assert load_error() == 1
        path.write_text(edited + line("bob", "viewer", "bob-token"))  # still broken: bob's line is back
        clock.advance(2)
        assert names(operators, *tokens) == ["admin", "alice", "bob", None, None, None]
        path.write_text(edited.replace("operatr", "operator"))
        clock.advance(2)
        assert names(operators, *tokens) == ["admin", "alice", None, "carol", "dave", "erin"]
        assert operators.problem() is None and load_error() == 0
    assert [(entry["event"], entry.get("reason")) for entry in logs] == [
        ("admin-operators-file-invalid", "line 4: unknown role 'operatr' (viewer or operator)"),
        ("admin-operators-reloaded", None),
    ]
    assert (logs[0]["viewers"], logs[0]["operators"]) == (0, 2)  # in force: admin and alice
    assert_no_secret_in(logs, *tokens)


def test_a_file_that_is_not_utf8_keeps_the_operators_of_its_unchanged_lines(tokens_file: Path) -> None:
    clock = ManualClock()
    operators = Operators(None, tokens_file, clock=clock)
    bob = line("bob", "viewer", "bob-token").encode()
    tokens_file.write_bytes(tokens_file.read_bytes().replace(bob, b"b\xf6b" + bob[3:]))  # latin-1 bob
    clock.advance(2)
    assert names(operators, "alice-token", "bob-token") == ["alice", None]
    assert operators.problem() == (
        f"PIN_IDENTITY_ADMIN_TOKENS_FILE: {tokens_file} is not UTF-8 text; "
        "only the operators whose line is unchanged stay in force"
    )


def test_a_file_gone_missing_leaves_none_of_its_operators_but_the_token_variables(tokens_file: Path) -> None:
    clock = ManualClock()
    operators = Operators("admin-token", tokens_file, clock=clock)
    good = tokens_file.read_text()
    tokens_file.unlink()
    clock.advance(2)
    with capture_logs() as logs:
        for _ in range(3):  # looked at again and again: one line per problem
            clock.advance(2)
            assert names(operators, "admin-token", "alice-token", "bob-token") == ["admin", None, None]
        assert operators.problem() == (
            f"PIN_IDENTITY_ADMIN_TOKENS_FILE: cannot read {tokens_file} (No such file or directory); "
            "none of its operators is in force"
        )
        assert load_error() == 1
        tokens_file.write_text(good)
        clock.advance(2)
        assert names(operators, "admin-token", "alice-token", "bob-token") == ["admin", "alice", "bob"]
        assert load_error() == 0
    assert [(entry["event"], entry.get("reason", "")) for entry in logs] == [
        ("admin-operators-file-invalid", f"cannot read {tokens_file} (No such file or directory)"),
        ("admin-operators-reloaded", ""),
    ]
    assert (logs[0]["viewers"], logs[0]["operators"]) == (0, 1)
    assert_no_secret_in(logs, "admin-token", "alice-token", "bob-token")


def test_a_byte_order_mark_is_not_part_of_the_first_line(tmp_path: Path) -> None:
    """Editors on Windows write one; the file is still UTF-8."""
    path = tmp_path / "operators"
    path.write_bytes(b"\xef\xbb\xbf" + line("alice", "operator", "alice-token").encode())
    clock = ManualClock()
    operators = Operators(None, path, clock=clock)
    assert names(operators, "alice-token") == ["alice"]
    path.write_bytes(b"\xef\xbb\xbf# operators\n" + line("bob", "viewer", "bob-token").encode())
    clock.advance(2)
    assert names(operators, "alice-token", "bob-token") == [None, "bob"]
    assert operators.problem() is None


@pytest.mark.parametrize(
    ("mode", "readable_by"), [(0o640, "group"), (0o604, "others"), (0o644, "group and others")]
)
def test_a_file_others_can_read_is_warned_about_once(tmp_path: Path, mode: int, readable_by: str) -> None:
    """The digests are unsalted: whoever reads them can try guesses at a weak token offline."""
    path = tmp_path / "operators"
    path.write_text(line("alice", "operator", "alice-token"))
    path.chmod(mode)
    clock = ManualClock()
    with capture_logs() as logs:
        operators = Operators(None, path, clock=clock)
        for _ in range(3):
            clock.advance(2)
            assert names(operators, "alice-token") == ["alice"]  # a warning, not a refusal
        path.chmod(0o600)
        clock.advance(2)
        operators.current()
    assert logs == [
        {
            "event": "admin-operators-file-readable",
            "component": "admin-http",
            "path": str(path),
            "mode": f"{mode:04o}",
            "readable_by": readable_by,
            "log_level": "warning",
        }
    ]


@pytest.mark.parametrize("mode", [0o600, 0o400])
def test_a_file_only_its_owner_reads_is_not_warned_about(tmp_path: Path, mode: int) -> None:
    path = tmp_path / "operators"
    path.write_text(line("alice", "operator", "alice-token"))
    path.chmod(mode)
    with capture_logs() as logs:
        Operators(None, path, clock=ManualClock()).current()
    assert logs == []


@pytest.mark.parametrize(
    ("mode", "owner", "reader", "readable_by"),
    [
        (0o440, 0, 10001, None),  # a mounted Kubernetes Secret: root's file, in the pod's group (fsGroup)
        (0o444, 0, 10001, "others"),
        (0o640, 10001, 10001, "group"),  # the reader's own file: its group is anyone's
        (0o640, 0, 0, "group"),
        (0o604, 10001, 10001, "others"),
        (0o600, 10001, 10001, None),
    ],
)
def test_who_else_may_read_the_file(mode: int, owner: int, reader: int, readable_by: str | None) -> None:
    """PostgreSQL's rule for its key file: group-readable is fine only for a file root owns (whoever put
    the reader in that group meant it), never for the reader's own file; others, never."""
    assert readers_besides_the_owner(mode, owner=owner, reader=reader) == readable_by


# ---------------------------------------------------------------- the audit line


def test_an_audit_line_names_the_operator_and_the_client_beside_it() -> None:
    with capture_logs() as logs:
        admin_action("fanout-replay", Actor("http:alice", client="10.1.2.3"), task_id="t")
        admin_action("fanout-replay", Actor("cli:deploy"), task_id="t")
    assert [(e["who"], e.get("client")) for e in logs] == [("http:alice", "10.1.2.3"), ("cli:deploy", None)]
    assert "client" not in logs[1]


# ---------------------------------------------------------------- a file that does not answer


def test_a_file_whose_read_hangs_keeps_the_last_operators_and_holds_no_caller(tokens_file: Path) -> None:
    """A FIFO nobody writes blocks its reader in open(), as a hung network mount does: callers wait for a look
    at most its timeout, the event loop's not at all, and the operators last in force stay until the read
    returns, when what it read is judged as any edit."""
    clock = ManualClock()
    operators = Operators(None, tokens_file, clock=clock, recheck_s=2.0, look_timeout_s=0.2)
    fifo = tokens_file.with_name("fifo")
    os.mkfifo(fifo)
    os.replace(fifo, tokens_file)
    clock.advance(2.0)

    started = time.monotonic()
    assert names(operators, "alice-token") == ["alice"]  # waited for the look, at most its timeout
    assert time.monotonic() - started < 1.0
    assert operators.problem() is None  # not past its timeout on the clock yet: nothing said
    clock.advance(0.2)
    with capture_logs() as logs:
        assert anyio.run(operators.authenticate_waiting, "bob-token") is not None  # no wait at all now
        problem = operators.problem()
    assert problem == (
        f"PIN_IDENTITY_ADMIN_TOKENS_FILE: {tokens_file} did not answer within 0.2 s (a hung mount?); "
        "the operators last loaded stay in force"
    )
    assert [line["event"] for line in logs] == ["admin-operators-file-unanswered"]
    assert load_error() == 1
    clock.advance(5.0)
    assert names(operators, "alice-token") == ["alice"]  # no second look while the first hangs

    # The mount answers: the FIFO is written (an edit that rotates alice), the look returns and is judged.
    with open(tokens_file, "w", encoding="utf-8") as writer:
        writer.write(line("alice", "operator", "alice-rotated"))
    wait_until(lambda: operators.problem() is None, "the answered look is in force")
    assert names(operators, "alice-token", "alice-rotated") == [None, "alice"]
    assert load_error() == 0
