"""All SQL of the application lives in named blocks of `queries.sql`, read once at import.

A block may hold another as a subquery with a line `-- include: <name>`, so a statement that builds on a
query (the fan-out's page writes the snapshots `rendered_access_snapshots` renders) never repeats its text.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import LiteralString

_BLOCK_HEADER = re.compile(r"^-- name: ([a-z0-9_]+)\s*$", re.MULTILINE)
_INCLUDE = re.compile(r"^\s*-- include: ([a-z0-9_]+)\s*$", re.MULTILINE)


def _load(path: Path) -> dict[str, LiteralString]:
    text = path.read_text(encoding="utf-8")
    names = _BLOCK_HEADER.findall(text)
    bodies = _BLOCK_HEADER.split(text)[2::2]
    if len(set(names)) != len(names):
        raise RuntimeError(f"duplicate query names in {path.name}")
    blocks = {name: body.strip().rstrip(";") for name, body in zip(names, bodies, strict=True)}
    return {name: _with_includes(body, blocks) for name, body in blocks.items()}


def _with_includes(body: str, blocks: dict[str, str]) -> LiteralString:
    def included(match: re.Match[str]) -> str:
        name = match.group(1)
        if _INCLUDE.search(blocks[name]):
            raise RuntimeError(f"query {name} is included and includes another: keep includes one level deep")
        return blocks[name]

    # The file is part of the package, never user input: its text is as literal as a constant (mypy reads
    # LiteralString as str, so this return needs no cast).
    return _INCLUDE.sub(included, body)


QUERIES = _load(Path(__file__).with_name("queries.sql"))


def query(name: str) -> LiteralString:
    return QUERIES[name]
