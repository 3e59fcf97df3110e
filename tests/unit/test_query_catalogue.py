"""Every named statement of queries.sql is used: a removed caller does not leave its SQL behind."""

from __future__ import annotations

import ast
from pathlib import Path

from pin_identity.adapters.postgres.catalogue import QUERIES

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
