"""The SQL catalogue: every named statement is used (a removed caller does not leave its SQL behind) and sits
beside the module that runs it; the folder's files make one namespace (a name given twice is refused, an
include reaches across files); includes are written out; an envelope template becomes a format() string."""

from __future__ import annotations

import ast
import uuid
from collections.abc import Iterable
from pathlib import Path

import pytest

from pin_identity.adapters.postgres.catalogue import FOLDER, QUERIES, Block, included_names, load, read_blocks
from pin_identity.adapters.postgres.outbox_writer import template_params
from pin_identity.domain.events import AccessChangeTemplate, EnvelopeSlot

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "pin_identity"


def _string_literals(paths: Iterable[Path]) -> set[str]:
    """Callers name a statement with a literal (`query("claim_fanout_task")`), never by building its name."""
    literals: set[str] = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                literals.add(node.value)
    return literals


def _unused(blocks: dict[str, Block], package: Path) -> list[str]:
    """Blocks no module names, nor includes in a block a module names."""
    named = _string_literals(package.rglob("*.py"))
    included = {inner for name in named & set(blocks) for inner in included_names(blocks[name].text)}
    return sorted(set(blocks) - named - included)


def _runners(name: str, blocks: dict[str, Block], modules: dict[str, set[str]]) -> list[str]:
    """The modules that run a block: that name it, or name a block that includes it."""
    outer = {name} | {other for other, block in blocks.items() if name in included_names(block.text)}
    return [module for module, literals in modules.items() if outer & literals]


def _misplaced(blocks: dict[str, Block], folder: Path) -> list[str]:
    """Blocks not where a reader looks for them: one of `x.sql` that `x.py` does not name, or one of a file
    named after no module (a shared file) that fewer than two of the folder's modules run."""
    modules = {path.stem: _string_literals([path]) for path in folder.glob("*.py")}
    misplaced = []
    for name, block in blocks.items():
        stem = Path(block.file).stem
        runners = _runners(name, blocks, modules)
        if (stem in modules and stem not in runners) or (stem not in modules and len(runners) < 2):
            misplaced.append(f"{block.file}: {name} (named by {', '.join(runners) or 'no module'})")
    return sorted(misplaced)


def _write(folder: Path, name: str, text: str) -> None:
    (folder / name).write_text(text, encoding="utf-8")


# ---------------------------------------------------------------- the package's own statements


def test_every_named_query_is_used_in_the_package() -> None:
    assert len(QUERIES) > 50  # the blocks as the loader reads them
    assert _unused(read_blocks(FOLDER), PACKAGE) == []


def test_every_block_sits_beside_the_module_that_runs_it_or_in_a_file_several_share() -> None:
    blocks = read_blocks(FOLDER)
    assert len({block.file for block in blocks.values()}) > 10  # one file a store, not one for all
    assert _misplaced(blocks, FOLDER) == []


def test_an_included_query_is_written_out_in_the_statement_that_includes_it() -> None:
    assert QUERIES["rendered_access_snapshots"] in QUERIES["write_access_changes"]
    assert not [name for name, text in QUERIES.items() if "-- include:" in text]


# ---------------------------------------------------------------- the loader, on folders of its own


def test_the_files_of_a_folder_make_one_namespace(tmp_path: Path) -> None:
    _write(tmp_path, "a.sql", "-- name: one\nSELECT 1;\n")
    _write(tmp_path, "b.sql", "-- A file's header.\n\n-- name: two\nSELECT 2;\n")
    assert load(tmp_path) == {"one": "SELECT 1", "two": "SELECT 2"}


def test_a_name_given_in_two_files_is_refused_with_both_files_named(tmp_path: Path) -> None:
    _write(tmp_path, "a.sql", "-- name: one\nSELECT 1;\n")
    _write(tmp_path, "b.sql", "-- name: one\nSELECT 2;\n")
    with pytest.raises(RuntimeError, match=r"^query one is named twice: in a\.sql and in b\.sql$"):
        load(tmp_path)


def test_a_name_given_twice_in_one_file_is_refused(tmp_path: Path) -> None:
    _write(tmp_path, "a.sql", "-- name: one\nSELECT 1;\n\n-- name: one\nSELECT 2;\n")
    with pytest.raises(RuntimeError, match=r"^query one is named twice: in a\.sql$"):
        load(tmp_path)


def test_an_include_reaches_a_block_of_another_file(tmp_path: Path) -> None:
    outer = "-- name: outer\nSELECT n FROM (\n-- include: inner\n) AS i;\n"
    _write(tmp_path, "a.sql", outer)
    _write(tmp_path, "b.sql", "-- name: inner\nSELECT 1 AS n;\n")
    assert load(tmp_path)["outer"] == "SELECT n FROM (\nSELECT 1 AS n\n) AS i"


def test_an_include_of_no_block_or_two_levels_deep_is_refused(tmp_path: Path) -> None:
    _write(tmp_path, "a.sql", "-- name: outer\nSELECT * FROM (\n-- include: gone\n) AS i;\n")
    with pytest.raises(RuntimeError, match="query gone is included but no file names it"):
        load(tmp_path)
    _write(tmp_path, "b.sql", "-- name: gone\nSELECT * FROM (\n-- include: leaf\n) AS l;\n")
    _write(tmp_path, "c.sql", "-- name: leaf\nSELECT 1;\n")
    with pytest.raises(RuntimeError, match="query gone is included and includes another"):
        load(tmp_path)


def test_an_include_names_the_columns_its_block_is_written_with(tmp_path: Path) -> None:
    _write(tmp_path, "a.sql", "-- name: mine\n{owner} = %(claim_id)s AND {status} = 'InProgress';\n")
    include = "-- include: mine (owner = t.lease_owner, status = t.status)"
    outer = f"-- name: fence\nUPDATE t SET n = 1 WHERE id = 1 AND (\n{include}\n);\n"
    _write(tmp_path, "b.sql", outer)
    assert load(tmp_path)["fence"] == (
        "UPDATE t SET n = 1 WHERE id = 1 AND (\nt.lease_owner = %(claim_id)s AND t.status = 'InProgress'\n)"
    )


@pytest.mark.parametrize(
    "given", ["", "(owner = lease_owner)", "(owner = lease_owner, status = status, lease = x)", "(owner)"]
)
def test_an_include_whose_columns_are_left_out_unknown_or_unsaid_is_refused(
    tmp_path: Path, given: str
) -> None:
    _write(tmp_path, "a.sql", "-- name: mine\n{owner} = %(claim_id)s AND {status} = 'InProgress';\n")
    _write(tmp_path, "b.sql", f"-- name: fence\nSELECT 1 WHERE\n-- include: mine {given}\n;\n")
    with pytest.raises(RuntimeError, match=r"^query mine is included with "):
        load(tmp_path)


def test_a_folder_without_sql_is_refused(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match=r"^no \.sql file in "):
        load(tmp_path)


def test_a_block_no_module_names_is_found(tmp_path: Path) -> None:
    _write(tmp_path, "store.sql", "-- name: run\nSELECT 1;\n-- name: left\nSELECT 2;\n")
    _write(tmp_path, "store.py", 'STATEMENT = "run"\n')
    assert _unused(read_blocks(tmp_path), tmp_path) == ["left"]


def test_a_block_only_included_is_used_while_a_block_some_module_names_includes_it(tmp_path: Path) -> None:
    outer = "-- name: run\nSELECT 1 WHERE\n-- include: part\n;\n"
    _write(tmp_path, "store.sql", outer + "-- name: gone\nSELECT 2 WHERE\n-- include: lost\n;\n")
    _write(tmp_path, "shared.sql", "-- name: part\ntrue\n-- name: lost\ntrue\n")
    _write(tmp_path, "store.py", 'STATEMENT = "run"\n')
    assert _unused(read_blocks(tmp_path), tmp_path) == ["gone", "lost"]


def test_a_block_away_from_its_module_or_a_shared_block_one_module_runs_is_found(tmp_path: Path) -> None:
    _write(tmp_path, "store.sql", "-- name: mine\nSELECT 1;\n-- name: theirs\nSELECT 2;\n")
    _write(tmp_path, "shared.sql", "-- name: common\nSELECT 3;\n-- name: lonely\nSELECT 4;\n")
    _write(tmp_path, "store.py", 'A, B = "mine", "common"\n')
    _write(tmp_path, "other.py", 'A, B, C = "theirs", "common", "lonely"\n')
    assert _misplaced(read_blocks(tmp_path), tmp_path) == [
        "shared.sql: lonely (named by other)",
        "store.sql: theirs (named by other)",
    ]


# ---------------------------------------------------------------- envelope templates


def test_a_template_becomes_a_format_string_whose_own_percent_signs_are_escaped() -> None:
    template = AccessChangeTemplate(
        pieces=('{"a":', ',"b":"100%",', ',"c":', "}"),
        slots=(EnvelopeSlot.EVENT_ID, EnvelopeSlot.USER_ID, EnvelopeSlot.ACTIVE_ASSIGNMENTS),
        correlation_id=uuid.UUID(int=1),
        traceparent=None,
    )
    assert template_params(template)["envelope"] == '{"a":%1$s,"b":"100%%",%2$s,"c":%4$s}'
