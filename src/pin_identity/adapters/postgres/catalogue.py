"""All SQL of the application lives in named blocks of `queries.sql`, read once at import."""

from __future__ import annotations

import re
from pathlib import Path
from typing import LiteralString, cast

_BLOCK_HEADER = re.compile(r"^-- name: ([a-z0-9_]+)\s*$", re.MULTILINE)


def _load(path: Path) -> dict[str, LiteralString]:
    text = path.read_text(encoding="utf-8")
    names = _BLOCK_HEADER.findall(text)
    bodies = _BLOCK_HEADER.split(text)[2::2]
    if len(set(names)) != len(names):
        raise RuntimeError(f"duplicate query names in {path.name}")
    # The file is part of the package, never user input: its text is as literal as a constant.
    return {
        name: cast(LiteralString, body.strip().rstrip(";")) for name, body in zip(names, bodies, strict=True)
    }


QUERIES = _load(Path(__file__).with_name("queries.sql"))


def query(name: str) -> LiteralString:
    return QUERIES[name]
