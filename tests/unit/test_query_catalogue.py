"""The SQL catalogue: every named statement is used (a removed caller does not leave its SQL behind), includes
are written out, and an envelope template becomes a format() string."""

from __future__ import annotations

import ast
import uuid
from pathlib import Path

from pin_identity.adapters.postgres.catalogue import QUERIES
from pin_identity.adapters.postgres.outbox_writer import template_params
from pin_identity.domain.events import AccessChangeTemplate, EnvelopeSlot

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "pin_identity"


def _string_literals() -> set[str]:
    """Callers name a statement with a literal (`query("claim_fanout_task")`), never by building its name."""
    literals: set[str] = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                literals.add(node.value)
    return literals


def test_every_named_query_is_used_in_the_package() -> None:
    assert len(QUERIES) > 50  # the blocks as the loader reads them
    assert sorted(set(QUERIES) - _string_literals()) == []


def test_an_included_query_is_written_out_in_the_statement_that_includes_it() -> None:
    assert QUERIES["rendered_access_snapshots"] in QUERIES["write_access_changes"]
    assert not [name for name, text in QUERIES.items() if "-- include:" in text]


def test_a_template_becomes_a_format_string_whose_own_percent_signs_are_escaped() -> None:
    template = AccessChangeTemplate(
        pieces=('{"a":', ',"b":"100%",', ',"c":', "}"),
        slots=(EnvelopeSlot.EVENT_ID, EnvelopeSlot.USER_ID, EnvelopeSlot.ACTIVE_ASSIGNMENTS),
        correlation_id=uuid.UUID(int=1),
        traceparent=None,
    )
    assert template_params(template)["envelope"] == '{"a":%1$s,"b":"100%%",%2$s,"c":%4$s}'
