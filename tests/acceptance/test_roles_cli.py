"""`pin-identity roles list|show`: the console's Roles view on the command line; `--json` as the API."""

from __future__ import annotations

import json

from pin_identity.composition import Container
from tests.support import seed
from tests.support.cli import run_cli


def _holder(container: Container) -> None:
    seed.held_role(container.stores.identity_transactions, 1)


def test_roles_list_and_show_print_the_consoles_roles(
    container: Container, subprocess_env: dict[str, str]
) -> None:
    _holder(container)
    listed = run_cli(subprocess_env, "roles", "list", "--code", "sales-manager", "--json")
    assert listed.returncode == 0, listed.stderr
    [role] = json.loads(listed.stdout)
    assert (role["code"], role["holders"], role["permissions"], role["version"]) == (
        "sales-manager",
        1,
        ["deals.read"],
        1,
    )
    shown = run_cli(subprocess_env, "roles", "show", role["roleId"], "--json")
    assert json.loads(shown.stdout) == role
    table = run_cli(subprocess_env, "roles", "list")
    assert "developer-manager" in table.stdout and "system role" in table.stdout
    assert role["roleId"] in table.stdout
    one = run_cli(subprocess_env, "roles", "show", role["roleId"])
    assert "holders" in one.stdout and "deals.read" in one.stdout
