"""`pin-identity roles list|show`: the console's Roles view on the command line; `--json` as the API.
`roles set-permissions` refuses what the API refuses."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from pin_identity.composition import Container
from pin_identity.config import Settings
from pin_identity.entrypoints.admin_http import create_app
from tests.support import seed
from tests.support.cli import run_cli
from tests.support.operators import bearer

TOKEN = "secret-token"  # PIN_IDENTITY_ADMIN_TOKEN


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


# What a permission code may be is the domain's rule: each surface refuses the same sets.
REFUSED_SETS = {
    "a code of 201 characters": ["p" * 201],
    "a control character": ["deals\tread"],
    "1001 codes": [f"deals.{n}" for n in range(1001)],
}


@pytest.mark.parametrize("codes", REFUSED_SETS.values(), ids=REFUSED_SETS.keys())
def test_a_permission_set_the_api_refuses_is_refused_on_the_command_line_too(
    settings: Settings, container: Container, subprocess_env: dict[str, str], codes: list[str]
) -> None:
    _, role_id = seed.held_role(container.stores.identity_transactions, 1)
    before = run_cli(subprocess_env, "roles", "show", str(role_id), "--json")
    admin = Container(settings.model_copy(update={"admin_token": TOKEN}))
    try:
        with TestClient(create_app(admin)) as client:
            answer = client.put(
                f"/admin/v1/roles/{role_id}/permissions", json={"permissions": codes}, headers=bearer(TOKEN)
            )
    finally:
        admin.close()
    assert (answer.status_code, answer.json()["code"]) == (422, "IDENTITY_INVALID_REQUEST")

    refused = run_cli(subprocess_env, "roles", "set-permissions", str(role_id), *codes)

    assert refused.returncode == 2, refused.stdout
    [line] = refused.stderr.splitlines()
    assert line.startswith("error: IDENTITY_INVALID_INPUT: "), line
    after = run_cli(subprocess_env, "roles", "show", str(role_id), "--json")
    assert after.stdout == before.stdout  # the same set and version: nothing was written
