"""The documents a newcomer reads hold together: every link between them lands on a file and a heading that
exist, every `pin-identity` command they name is one, every module or file they name is in the tree, and every
alert's runbook link names a runbook section."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
import typer
import yaml

from pin_identity.entrypoints.cli import app

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = sorted(
    [ROOT / "README.md", ROOT / "BENCHMARKS.md", ROOT / "deploy" / "README.md", *ROOT.glob("docs/*.md")]
)
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_HEADING = re.compile(r"^#{1,6} +(.+?) *#*$", re.MULTILINE)
_FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
_HTML_ANCHOR = re.compile(r'<a id="([^"]+)"></a>')
_CODE = re.compile(r"`([^`\n]+)`")
# A command as a reader would type it: a `code` span, or a line of a code block, that starts with it.
_COMMAND = re.compile(r"^(?:\$ )?pin-identity((?: +[a-z][a-z-]*)+)")
# A file the documents name: a path inside the repository, or a bare module name of ours.
_FILE = re.compile(r"^(?:\.\./)*([\w./-]+\.(?:py|sql|md|sh|yml|yaml|toml|js|json))$")
# Named, not ours: the specs beside the repository, other projects' files, what `make alerts` writes, routes.
_OUTSIDE = ("../shared/", "shared/spec/", "sequence.c", "kafka-acls.sh", "build/", "/")


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(document: Path) -> set[str]:
    text = _FENCE.sub("", document.read_text(encoding="utf-8"))
    return {_slug(heading) for heading in _HEADING.findall(text)} | set(_HTML_ANCHOR.findall(text))


def _prose(document: Path) -> str:
    return _FENCE.sub("", document.read_text(encoding="utf-8"))


def _links() -> Iterator[tuple[Path, str]]:
    for document in DOCUMENTS:
        for target in _LINK.findall(_prose(document)):
            if not re.match(r"[a-z]+:", target):
                yield document, target


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda path: str(path.relative_to(ROOT)))
def test_every_link_lands_on_a_file_and_a_heading_that_exist(document: Path) -> None:
    broken = []
    for source, target in _links():
        if source != document:
            continue
        path, _, anchor = target.partition("#")
        landing = (document.parent / path).resolve() if path else document
        if not landing.exists():
            broken.append(f"{target}: no such file")
        elif anchor and landing.suffix == ".md" and anchor not in _anchors(landing):
            broken.append(f"{target}: no heading with that anchor in {landing.relative_to(ROOT)}")
    assert not broken, f"{document.relative_to(ROOT)}: " + "; ".join(broken)


def _command_tree() -> dict[str, set[str]]:
    """Each command of the CLI, with its subcommands (none for a plain command)."""
    root = typer.main.get_command(app)
    commands: dict[str, click.Command] = getattr(root, "commands", {})
    return {name: set(getattr(command, "commands", {})) for name, command in commands.items()}


def _commands_named(document: Path) -> Iterator[str]:
    text = document.read_text(encoding="utf-8")
    code = [line.strip() for block in _FENCE.findall(text) for line in block.splitlines()]
    for snippet in [*code, *_CODE.findall(_FENCE.sub("", text))]:
        if found := _COMMAND.match(snippet):
            yield found.group(1)


def test_every_command_the_documents_name_exists() -> None:
    tree, unknown = _command_tree(), []
    for document in DOCUMENTS:
        for words in _commands_named(document):
            name, *rest = words.split()
            if name not in tree:
                unknown.append(f"{document.relative_to(ROOT)}: pin-identity {name}")
            elif tree[name] and rest and rest[0] not in tree[name]:
                unknown.append(f"{document.relative_to(ROOT)}: pin-identity {name} {rest[0]}")
    assert not unknown, unknown


def _files_of_the_tree() -> tuple[set[str], set[str]]:
    """Every path of the repository (os.walk: a directory a running server removes meanwhile is skipped)."""
    paths: set[str] = set()
    for folder, subfolders, files in os.walk(ROOT):
        subfolders[:] = [name for name in subfolders if name not in _NOT_THE_TREE]
        relative = Path(folder).relative_to(ROOT)
        paths |= {str(relative / name) for name in [*subfolders, *files]}
    return paths, {Path(p).name for p in paths}


_NOT_THE_TREE = frozenset({".git", ".venv", ".pin-identity", "__pycache__", ".mypy_cache", ".ruff_cache"})


def test_every_module_and_file_the_documents_name_exists() -> None:
    paths, names = _files_of_the_tree()
    package = {p.removeprefix("src/pin_identity/") for p in paths if p.startswith("src/pin_identity/")}
    missing = []
    for document in DOCUMENTS:
        for code in _CODE.findall(_prose(document)):
            found = _FILE.match(code.strip())
            if found is None or code.startswith(_OUTSIDE):
                continue
            named = found.group(1)
            known = named in paths or named in package or ("/" not in named and named in names)
            if not known and not any(p.endswith("/" + named) for p in paths):
                missing.append(f"{document.relative_to(ROOT)}: `{code}`")
    assert not missing, missing


def test_every_alert_links_to_an_existing_runbook_section() -> None:
    rules = yaml.safe_load((ROOT / "deploy/prometheus/alerts.yml").read_text(encoding="utf-8"))
    linked = {
        rule["annotations"]["runbook_url"].split("#", 1)[1]
        for group in rules["groups"]
        for rule in group["rules"]
    }
    assert linked
    assert linked - _anchors(ROOT / "docs" / "runbooks.md") == set()
