"""The operators of the admin API (admin_http.tokens): the tokens file's lines, white space around tokens, the
file read again on its own clock, and a file that cannot be used leaving the operators as they were."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from pin_identity.config import ConfigurationError
from pin_identity.entrypoints.admin_http.tokens import (
    Operators,
    OperatorsFileError,
    parse_operators,
    token_digest,
)
from pin_identity.entrypoints.documents import AdminRole
from pin_identity.operations.audit import Actor, admin_action
from tests.support.clocks import ManualClock


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
            Operators("the-token", path)


# ---------------------------------------------------------------- tokens and roles


def test_white_space_around_a_token_is_not_part_of_it(tokens_file: Path) -> None:
    operators = Operators("  admin-token\n", tokens_file)
    assert names(operators, "admin-token", " admin-token ", "alice-token\n", "\tbob-token") == [
        "admin",
        "admin",
        "alice",
        "bob",
    ]
    assert names(operators, "", "admin", "alice-token2", "bob-token bob-token") == [None] * 4


def test_the_single_token_is_the_operator_admin() -> None:
    [admin] = Operators("t0ken", None).current()
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
        Operators(token, None)


def test_a_file_that_cannot_be_used_at_start_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match=r"^PIN_IDENTITY_ADMIN_TOKENS_FILE: cannot read .*missing"):
        Operators(None, tmp_path / "missing")
    (tmp_path / "broken").write_text("alice operator\n")
    with pytest.raises(ConfigurationError, match=r"^PIN_IDENTITY_ADMIN_TOKENS_FILE: line 1: 2 fields"):
        Operators("t0ken", tmp_path / "broken")


def test_an_empty_file_is_no_operator_yet() -> None:
    """A file with no line yet is valid: operators may be added later, without a restart."""
    operators = Operators(None, Path("/dev/null"))
    assert operators.current() == () and operators.problem() is None


# ---------------------------------------------------------------- edits while serving


def test_an_edit_is_in_force_at_the_first_look_after_the_recheck_interval(tokens_file: Path) -> None:
    clock = ManualClock()
    operators = Operators(None, tokens_file, clock=clock.monotonic, recheck_s=2.0)
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


def test_a_broken_file_keeps_the_previous_operators_says_so_once_and_recovers(tokens_file: Path) -> None:
    clock = ManualClock()
    operators = Operators("admin-token", tokens_file, clock=clock.monotonic)
    good = tokens_file.read_text()
    with capture_logs() as logs:
        for broken in (good + "dave operatr " + sha("dave") + "\n", None):
            if broken is None:
                tokens_file.unlink()
            else:
                tokens_file.write_text(broken)
            for _ in range(3):  # looked at again and again: one line per problem
                clock.advance(2)
                assert names(operators, "admin-token", "alice-token", "bob-token", "dave") == [
                    "admin",
                    "alice",
                    "bob",
                    None,
                ]
            problem = operators.problem()
            assert problem is not None and problem.startswith("PIN_IDENTITY_ADMIN_TOKENS_FILE: ")
            assert problem.endswith("; the operators read before stay in force")
        tokens_file.write_text(good)
        clock.advance(2)
        assert operators.problem() is None
    assert [(entry["event"], entry.get("reason", "")) for entry in logs] == [
        ("admin-operators-file-invalid", "line 3: unknown role 'operatr' (viewer or operator)"),
        ("admin-operators-file-invalid", f"cannot read {tokens_file} (No such file or directory)"),
        ("admin-operators-reloaded", ""),
    ]


# ---------------------------------------------------------------- the audit line


def test_an_audit_line_names_the_operator_and_the_client_beside_it() -> None:
    with capture_logs() as logs:
        admin_action("fanout-replay", Actor("http:alice", client="10.1.2.3"), task_id="t")
        admin_action("fanout-replay", Actor("cli:deploy"), task_id="t")
    assert [(e["who"], e.get("client")) for e in logs] == [("http:alice", "10.1.2.3"), ("cli:deploy", None)]
    assert "client" not in logs[1]
