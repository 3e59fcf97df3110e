"""All SQL of the application lives in named blocks of this folder's `.sql` files, read once at import.

Each module's statements sit beside it, in a file of its name (`fanout_queue.sql` beside `fanout_queue.py`);
a block that several stores run, none of them its owner, has a file of its own (`access_rendering.sql`). The
files make one namespace: a caller names a block alone, never its file, so a name given twice, in one file or
two, is refused at load.

A block may hold another, from any file, as a subquery with a line `-- include: <name>`, so a statement that
builds on a query (the fan-out's page writes the snapshots `rendered_access_snapshots` renders) never repeats
its text. A block written for tables whose columns are named apart (the lease conditions of `leases.sql`,
which two queues share) names them `{column}`, and each line that includes it says which column each is:
`-- include: lease_still_mine (owner = lease_owner, status = status)`; a name left out, or one the block does
not have, is refused at load.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import LiteralString, NamedTuple

_BLOCK_HEADER = re.compile(r"^-- name: ([a-z0-9_]+)\s*$", re.MULTILINE)
_INCLUDE = re.compile(r"^\s*-- include: ([a-z0-9_]+)(?: \(([^)]*)\))?\s*$", re.MULTILINE)
_COLUMN = re.compile(r"\{([a-z_]+)\}")


class Block(NamedTuple):
    file: str  # the name of the file that holds it: what a refusal names, and where a reader finds it
    text: str  # as written, its includes not written out


def read_blocks(folder: Path) -> dict[str, Block]:
    """Every named block of the folder's `*.sql` files, read in name order (a refusal reads the same on any
    machine)."""
    paths = sorted(folder.glob("*.sql"))
    if not paths:
        # A package built without its SQL fails at import, not at its first statement.
        raise RuntimeError(f"no .sql file in {folder}")
    blocks: dict[str, Block] = {}
    for path in paths:
        for name, text in _named_blocks(path.read_text(encoding="utf-8")):
            if name in blocks:
                files = " and in ".join(dict.fromkeys((blocks[name].file, path.name)))
                raise RuntimeError(f"query {name} is named twice: in {files}")
            blocks[name] = Block(path.name, text)
    return blocks


def _named_blocks(text: str) -> Iterator[tuple[str, str]]:
    names = _BLOCK_HEADER.findall(text)
    bodies = _BLOCK_HEADER.split(text)[2::2]
    for name, body in zip(names, bodies, strict=True):
        yield name, body.strip().rstrip(";")


def load(folder: Path) -> dict[str, LiteralString]:
    """The folder's blocks by name, each ready to run: its includes written out."""
    blocks = {name: block.text for name, block in read_blocks(folder).items()}
    return {name: _with_includes(body, blocks) for name, body in blocks.items()}


def included_names(text: str) -> list[str]:
    """The blocks a block's text includes, by name."""
    return [match.group(1) for match in _INCLUDE.finditer(text)]


def _with_includes(body: str, blocks: dict[str, str]) -> LiteralString:
    def included(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in blocks:
            raise RuntimeError(f"query {name} is included but no file names it")
        if _INCLUDE.search(blocks[name]):
            raise RuntimeError(f"query {name} is included and includes another: keep includes one level deep")
        return _with_columns(name, blocks[name], match.group(2) or "")

    # The files are part of the package, never user input: their text is as literal as a constant (mypy reads
    # LiteralString as str, so this return needs no cast).
    return _INCLUDE.sub(included, body)


def _with_columns(name: str, text: str, given: str) -> str:
    """An included block's `{column}` names written out as the include line gives them (`a = t.b, ...`)."""
    columns = dict(_column_pair(name, pair) for pair in given.split(",") if pair.strip())
    wanted = set(_COLUMN.findall(text))
    if wanted != set(columns):
        raise RuntimeError(
            f"query {name} is included with columns {sorted(columns)}, but it names {sorted(wanted)}"
        )
    return _COLUMN.sub(lambda match: columns[match.group(1)], text)


def _column_pair(name: str, pair: str) -> tuple[str, str]:
    placeholder, _, column = (part.strip() for part in pair.partition("="))
    if not placeholder or not column:
        raise RuntimeError(
            f"query {name} is included with '{pair.strip()}': a column is given as `name = column`"
        )
    return placeholder, column


FOLDER = Path(__file__).parent
QUERIES = load(FOLDER)


def query(name: str) -> LiteralString:
    return QUERIES[name]
