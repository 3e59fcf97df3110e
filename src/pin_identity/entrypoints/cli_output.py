"""How the commands print for people: tables that never cut an id or a code, values in words.

An id is what the next command needs (`fanout replay TASK_ID`, `replay-failed --item ID`) and a code is what
the runbook is searched for: their columns keep every character on one line while the other columns wrap.
When a terminal is too narrow for that, each row is printed as a block of `label  value` lines instead (as
psql's expanded display does).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import typer
from pydantic import BaseModel
from rich import box
from rich.console import Console
from rich.table import Table

NOTHING = "-"
# A wrapping column is kept as wide as its longest word, up to this (a longer word folds).
_WIDEST_WORD = 16
# Box drawing: each column's padding and its border, plus the table's left edge.
_PER_COLUMN, _EDGE = 3, 1


@dataclass(frozen=True)
class Column:
    header: str
    whole: bool = False  # an id or a code: never wrapped, never cut


def stdout() -> Console:
    # Off a terminal rich assumes 80 columns unless COLUMNS says otherwise; soft_wrap off keeps tables intact.
    return Console(highlight=False)


def when(moment: datetime | None) -> str:
    """A moment to the second, in UTC (`Z`)."""
    return f"{moment.astimezone(UTC):%Y-%m-%d %H:%M:%SZ}" if moment else NOTHING


def text(value: object) -> str:
    """A value in words: nothing is `-`, a flag is yes or no."""
    if value is None:
        return NOTHING
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def print_rows(
    columns: Sequence[Column], rows: Sequence[Sequence[str]], *, title: str, empty: str, console: Console
) -> None:
    """A table when the terminal holds every id and code whole beside the other columns, else blocks."""
    if not rows:
        console.print(empty)
        return
    widths = [_narrowest(column, [row[index] for row in rows]) for index, column in enumerate(columns)]
    if sum(widths) + _PER_COLUMN * len(columns) + _EDGE <= console.width:
        console.print(_table(columns, widths, rows, title))
    else:
        _print_blocks(columns, rows, title, console)


def _narrowest(column: Column, values: Sequence[str]) -> int:
    """A whole column's longest value; a wrapping one's longest word (header included)."""
    if column.whole:
        return max(len(value) for value in [column.header, *values])
    words = [word for value in [column.header, *values] for word in value.split()]
    return min(max((len(word) for word in words), default=1), _WIDEST_WORD)


def _table(
    columns: Sequence[Column], widths: Sequence[int], rows: Sequence[Sequence[str]], title: str
) -> Table:
    table = Table(title=title, box=box.SIMPLE_HEAD, title_justify="left")
    for column, width in zip(columns, widths, strict=True):
        if column.whole:
            table.add_column(column.header, no_wrap=True, min_width=width)
        else:  # never narrower than its longest word: words wrap, they are not broken
            table.add_column(column.header, min_width=width, overflow="fold")
    for row in rows:
        table.add_row(*row)
    return table


def _print_blocks(
    columns: Sequence[Column], rows: Sequence[Sequence[str]], title: str, console: Console
) -> None:
    console.print(title)
    for row in rows:
        block = Table.grid(padding=(0, 2))
        block.add_column(no_wrap=True)
        block.add_column(overflow="fold")
        for column, value in zip(columns, row, strict=True):
            block.add_row(column.header, value)
        console.print()
        console.print(block)


def print_fields(fields: Sequence[tuple[str, object]], *, title: str, console: Console) -> None:
    """One thing's fields, a `label  value` line each."""
    table = Table.grid(padding=(0, 2))
    table.add_column(no_wrap=True, style="bold")
    table.add_column(overflow="fold")
    for label, value in fields:
        table.add_row(label, text(value))
    console.print(title)
    console.print(table)


def print_json(document: BaseModel | Sequence[BaseModel]) -> None:
    """The document as the HTTP API answers it: camelCase names, ISO-8601 timestamps."""
    if isinstance(document, BaseModel):
        body: object = document.model_dump(mode="json", by_alias=True)
    else:
        body = [item.model_dump(mode="json", by_alias=True) for item in document]
    typer.echo(json.dumps(body))
