"""What an error line says about a real PostgreSQL error: enough to act on, never the contact data the
server quotes (a unique violation's DETAIL, a value in the first line, a trigger's own message)."""

from __future__ import annotations

import json

import psycopg
import pytest
import structlog

from pin_identity.observability.logging import configure_logging, describe_error, get_logger

PHONE = "+79123456789"
EMAIL = "anna.smirnova@example.com"


def _refusal(database_url: str, statements: list[str]) -> psycopg.Error:
    with psycopg.connect(database_url) as conn, pytest.raises(psycopg.Error) as refused:
        for statement in statements:
            conn.execute(statement)
    return refused.value


def _contacts_in(text: str) -> list[str]:
    national = PHONE.removeprefix("+7")
    return [value for value in (PHONE, national, EMAIL) if value in text]


def test_a_unique_violation_names_its_constraint_not_the_phone(database_url: str) -> None:
    error = _refusal(
        database_url,
        [
            "CREATE TABLE contacts (phone text UNIQUE, email text)",
            f"INSERT INTO contacts VALUES ('{PHONE}', '{EMAIL}')",
            f"INSERT INTO contacts VALUES ('{PHONE}', '{EMAIL}')",
        ],
    )
    assert isinstance(error, psycopg.errors.UniqueViolation)
    assert PHONE in str(error)  # the server quotes it: this is what must not reach a log
    described = describe_error(error)
    assert described == (
        'UniqueViolation: duplicate key value violates unique constraint "contacts_phone_key"'
    )


@pytest.mark.parametrize(
    "statement",
    [
        f"SELECT '{PHONE} ext. 1'::bigint",  # the value in the first line
        f"DO $$ BEGIN RAISE EXCEPTION 'refused % of %', '+7 (912) 345-67-89', '{EMAIL}'; END $$",
    ],
    ids=["invalid-input", "raised-message"],
)
def test_values_in_the_first_line_are_masked(database_url: str, statement: str) -> None:
    error = _refusal(database_url, [statement])
    described = describe_error(error)
    assert _contacts_in(str(error).replace("(912) 345-67-89", "9123456789"))  # the server did quote them
    assert _contacts_in(described) == []
    assert "***6789" in described  # masked, still telling which number it was to someone who has it


def test_a_logged_exception_carries_its_frames_but_not_the_refused_row(
    database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    error = _refusal(
        database_url,
        [
            "CREATE TABLE contacts (phone text UNIQUE)",
            f"INSERT INTO contacts VALUES ('{PHONE}')",
            f"INSERT INTO contacts VALUES ('{PHONE}')",
        ],
    )
    configure_logging("json")
    try:
        try:
            raise RuntimeError("the batch failed") from error
        except RuntimeError:
            get_logger("test").exception("batch-failed")
        line = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
    finally:
        structlog.reset_defaults()
    assert line["event"] == "batch-failed"
    assert "UniqueViolation: duplicate key value" in line["exception"]
    assert "RuntimeError: the batch failed" in line["exception"]
    assert "test_a_logged_exception_carries_its_frames" in line["exception"]  # the frames are there
    assert PHONE not in line["exception"]
