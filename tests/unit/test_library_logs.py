"""A library's standard `logging` line rendered as ours: one JSON object, its level and logger named, an
exception among its arguments or attached to it reduced as `describe_error` reduces it (no detail lines, no
contacts); librdkafka's lines reach it through the Kafka clients' logger."""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import structlog
from confluent_kafka import Producer

from pin_identity.adapters.kafka.client_log import with_client_log
from pin_identity.observability.logging import LIBRARY_EVENT, configure_logging
from tests.support.waiting import holds_within

PHONE = "+79123456789"
EMAIL = "anna@example.com"
REFUSAL = f"duplicate key value violates unique constraint\nDETAIL:  Key (phone)=({PHONE}) {EMAIL} Ivanova"


@pytest.fixture
def json_logs() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    configure_logging("json")
    yield
    structlog.reset_defaults()
    root.handlers[:], root.level = handlers, level
    logging.captureWarnings(False)


def _lines(capsys: pytest.CaptureFixture[str]) -> list[dict[str, Any]]:
    return [json.loads(line) for line in capsys.readouterr().err.splitlines()]


def test_a_library_warning_is_one_json_line_naming_its_logger_and_level(
    json_logs: None, capsys: pytest.CaptureFixture[str]
) -> None:
    logging.getLogger("psycopg.pool").warning("error connecting in %r: %s", "pool", ValueError(REFUSAL))
    logging.getLogger("psycopg.pool").info("connection given by %r", "pool")  # below the libraries' level

    [line] = _lines(capsys)
    assert line["event"] == LIBRARY_EVENT
    assert (line["component"], line["logger"], line["level"]) == ("psycopg", "psycopg.pool", "warning")
    assert line["message"] == "error connecting in 'pool': duplicate key value violates unique constraint"
    assert "timestamp" in line


def test_a_library_traceback_and_its_message_stay_inside_the_line_without_contacts(
    json_logs: None, capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        raise RuntimeError(REFUSAL)
    except RuntimeError:
        logging.getLogger("uvicorn.error").exception("Exception in ASGI application\nfor %s", EMAIL)

    [line] = _lines(capsys)
    assert line["message"] == "Exception in ASGI application\nfor <e-mail>"
    assert "RuntimeError: duplicate key value" in line["exception"]
    assert "test_a_library_traceback" in line["exception"]  # the frames are there
    assert not any(value in json.dumps(line) for value in (PHONE, EMAIL, "Ivanova"))


def test_librdkafka_lines_come_through_the_clients_logger(
    json_logs: None, capsys: pytest.CaptureFixture[str]
) -> None:
    producer = Producer(with_client_log({"bootstrap.servers": "127.0.0.1:1", "reconnect.backoff.ms": 100}))
    written: list[str] = []

    def logged() -> bool:
        producer.poll(0.1)  # serves the client's log queue
        written.append(capsys.readouterr().err)
        return '"librdkafka"' in "".join(written)

    holds_within(logged, 10, every_s=0)
    output = "".join(written)
    lines = [json.loads(line) for line in output.splitlines()]
    assert any(line["logger"] == "librdkafka" and line["level"] == "error" for line in lines), output


class _OverlapDetectingStream:
    """A stream that notices a write begun while another is still under way (as two threads writing one
    `TextIOWrapper` at once would interleave or lose bytes)."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.overlaps = 0
        self._writing = threading.Event()

    def write(self, text: str) -> int:
        if self._writing.is_set():
            self.overlaps += 1
        self._writing.set()
        time.sleep(0.001)  # a slow terminal or pipe: long enough for the other thread to come in
        self.lines.append(text)
        self._writing.clear()
        return len(text)

    def flush(self) -> None:
        return


def test_a_library_line_and_one_of_ours_written_at_once_never_overlap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stream = _OverlapDetectingStream()
    monkeypatch.setattr(sys, "stderr", stream)
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    configure_logging("json")
    try:
        ours = threading.Thread(target=lambda: [structlog.get_logger().warning("ours") for _ in range(100)])
        ours.start()
        for _ in range(100):
            logging.getLogger("psycopg.pool").warning("theirs")
        ours.join()
    finally:
        structlog.reset_defaults()
        root.handlers[:], root.level = handlers, level
        logging.captureWarnings(False)
    assert stream.overlaps == 0
    assert len([json.loads(line) for line in "".join(stream.lines).splitlines()]) == 200
