"""`access audit`'s answer when the topic could not be read whole: its own exit status (4), and the
partitions named in the text and in the JSON."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from pin_identity.domain.access_verdicts import AuditReport
from pin_identity.entrypoints import access_cli
from pin_identity.entrypoints.cli import main


class _Audit:
    def __init__(self, report: AuditReport):
        self._report = report

    def access_audit(self, progress: Any) -> AuditReport:
        return self._report


class _Audited:
    """A container whose use cases answer one audit report."""

    def __init__(self, report: AuditReport):
        self.use_cases = _Audit(report)


@pytest.fixture
def incomplete(monkeypatch: pytest.MonkeyPatch) -> None:
    report = AuditReport(users=3, matching=3, incomplete_partitions=[1, 4])

    @contextmanager
    def container_from_env() -> Iterator[_Audited]:
        yield _Audited(report)

    monkeypatch.setattr(access_cli, "container_from_env", container_from_env)


@pytest.mark.usefixtures("incomplete")
def test_an_incomplete_read_exits_4_and_names_the_partitions_in_json(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["access", "audit", "--json"]) == access_cli.EXIT_INCOMPLETE == 4
    assert json.loads(capsys.readouterr().out)["incompletePartitions"] == [1, 4]


@pytest.mark.usefixtures("incomplete")
def test_an_incomplete_read_says_so_in_the_text(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["access", "audit"]) == 4
    out = capsys.readouterr().out
    assert "INCOMPLETE: partitions 1, 4 not read to their end" in out and "converged" not in out
