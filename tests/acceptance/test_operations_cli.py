"""The runbooks' commands as processes: quarantine listing and replay, retention, the audit of each action."""

from __future__ import annotations

import getpass
import json
import uuid
from typing import Any

from pin_identity.adapters.system_clock import SYSTEM_CLOCK
from pin_identity.domain.fanout_policy import FanOutPolicy
from pin_identity.domain.import_run import ImportMode, ImportRequest
from pin_identity.domain.talent import ImportStage
from pin_identity.simulation.simulated_talent import TalentDataset
from tests.support import seed, talent
from tests.support.cli import run_cli
from tests.support.talent_import import TalentWorld


def _env(subprocess_env: dict[str, str], world: TalentWorld) -> dict[str, str]:
    return {
        **subprocess_env,
        "PIN_IDENTITY_TALENT_API_URL": world.api.url,
        "PIN_IDENTITY_TALENT_API_TOKEN": "talent-token",
    }


def _rows(world: TalentWorld, sql: Any, params: Any = None) -> list[tuple[Any, ...]]:
    with world.container.connections.database.connection() as conn:
        return conn.execute(sql, params).fetchall()


def test_replaying_quarantined_items_after_fixing_their_cause(
    subprocess_env: dict[str, str], api_world: TalentWorld
) -> None:
    company, orphan_tenant = talent.tenant(), str(uuid.uuid4())
    investor = seed.user(api_world.container.stores.identity_transactions)
    [(phone,)] = _rows(api_world, "SELECT phone FROM identity.users WHERE id = %s", [investor])
    conflicting = talent.user(company["tenantId"], phone=phone)
    orphan = talent.user(orphan_tenant)
    api_world.publish(TalentDataset([company], [conflicting, orphan]))
    env = _env(subprocess_env, api_world)
    run = json.loads(run_cli(env, "talent-import", "run", "--mode", "api-pull", "--json").stdout)
    items = json.loads(run_cli(env, "talent-import", "failed-items", run["runId"], "--json").stdout)
    by_code = {item["errorCode"]: item["itemId"] for item in items}
    assert set(by_code) == {"IDENTITY_SYNC_PHONE_CONFLICT", "IDENTITY_SYNC_COMPANY_NOT_FOUND"}

    # The runbook's manual merge: the investor's account gets another number, then the item is replayed.
    with api_world.container.connections.database.connection() as conn:
        conn.execute("UPDATE identity.users SET phone = '+79990000001' WHERE id = %s", [investor])
        conn.commit()
    fixed = run_cli(
        env,
        "talent-import",
        "replay-failed",
        run["runId"],
        "--item",
        by_code["IDENTITY_SYNC_PHONE_CONFLICT"],
        "--json",
    )
    unfixed = run_cli(env, "talent-import", "replay-failed", run["runId"], "--json")

    assert json.loads(fixed.stdout) == {"applied": 1, "skipped": 0, "failed": 0, "notReplayable": 0}
    assert json.loads(unfixed.stdout) == {"applied": 0, "skipped": 0, "failed": 1, "notReplayable": 0}
    remaining = json.loads(run_cli(env, "talent-import", "failed-items", run["runId"], "--json").stdout)
    assert [(i["itemId"], i["errorCode"], i["attempts"]) for i in remaining] == [
        (by_code["IDENTITY_SYNC_COMPANY_NOT_FOUND"], "IDENTITY_SYNC_COMPANY_NOT_FOUND", 2)
    ]
    assert [u[0] for u in talent.replica_state(api_world.container)["users"]] == [conflicting["userId"]]
    audit = fixed.stderr + unfixed.stderr
    assert audit.count('"admin-action"') == 2


def test_prune_removes_finished_work_and_quarantine_payloads_but_keeps_failed_fanout_tasks(
    subprocess_env: dict[str, str], api_world: TalentWorld
) -> None:
    api_world.publish(TalentDataset([talent.tenant(company_type="Cooperative")], []))
    env = _env(subprocess_env, api_world)
    assert run_cli(env, "talent-import", "run", "--mode", "api-pull").returncode == 0
    talent.apply(api_world.container, ImportStage.TENANTS, [talent.raw(talent.tenant(company_type="Shop"))])
    failed_task = _failed_fanout_task(api_world)

    kept = run_cli(env, "maintenance", "prune", "--older-than", "30d", "--json")
    pruned = run_cli(env, "maintenance", "prune", "--older-than", "0s", "--json")
    bad = run_cli(env, "maintenance", "prune", "--older-than", "soon")

    assert json.loads(kept.stdout) == {"fanoutTasks": 0, "importRuns": 0, "quarantinePayloads": 0}
    assert json.loads(pruned.stdout) == {"fanoutTasks": 0, "importRuns": 1, "quarantinePayloads": 1}
    assert _rows(api_world, "SELECT payload FROM identity.talent_import_failed_items") == [(None,)]
    assert bad.returncode == 2 and bad.stderr.strip().startswith("error: ")
    # Its users past the cursor never got their event: it stays until replayed or discarded.
    failed = json.loads(run_cli(env, "fanout", "list", "--status", "Failed", "--json").stdout)
    assert [task["taskId"] for task in failed] == [failed_task]


def test_the_consumers_quarantine_from_the_command_line(
    subprocess_env: dict[str, str], api_world: TalentWorld
) -> None:
    company = talent.tenant()
    orphan = talent.user(company["tenantId"])
    talent.users(api_world.container, orphan)  # as the continuous consumer applies it: run_id null
    env = _env(subprocess_env, api_world)

    listed = json.loads(run_cli(env, "talent-import", "failed-items", "--consumer", "--json").stdout)
    assert [(i["externalId"], i["errorCode"], i["reason"]) for i in listed] == [
        (orphan["userId"], "IDENTITY_SYNC_COMPANY_NOT_FOUND", "the user's tenant is not in the replica")
    ]
    neither = run_cli(env, "talent-import", "failed-items")
    unknown = run_cli(env, "talent-import", "replay-failed", "--consumer", "--item", str(uuid.uuid4()))
    assert (neither.returncode, unknown.returncode) == (2, 2)
    assert "IDENTITY_NOT_FOUND" in unknown.stderr and len(unknown.stderr.strip().splitlines()) == 1
    talent.tenants(api_world.container, company)
    replayed = run_cli(env, "talent-import", "replay-failed", "--consumer", "--json")
    assert json.loads(replayed.stdout) == {"applied": 1, "skipped": 0, "failed": 0, "notReplayable": 0}
    table = run_cli(env, "talent-import", "failed-items", "--consumer")
    assert table.returncode == 0 and "IDENTITY_SYNC" not in table.stdout


def _audit_lines(stderr: str) -> list[dict[str, Any]]:
    lines = (json.loads(line) for line in stderr.splitlines() if line.startswith("{"))
    return [line for line in lines if line["event"] == "admin-action"]


def _failed_fanout_task(world: TalentWorld) -> str:
    """A role of one user changed through the queue, then failed as the job fails a poison task."""
    transactions = world.container.stores.identity_transactions
    _, role_id = seed.held_role(transactions, 1)
    change = seed.change_permissions(transactions, role_id, ["a"], FanOutPolicy(0))
    _rows(
        world,
        "UPDATE identity.access_fanout_tasks SET status = 'Failed' WHERE id = %s RETURNING id",
        [change.task_id],
    )
    return str(change.task_id)


def test_every_action_of_the_command_line_names_the_os_user_in_its_audit_line(
    subprocess_env: dict[str, str], api_world: TalentWorld
) -> None:
    api_world.publish(TalentDataset([talent.tenant(company_type="Cooperative")], []))
    env = _env(subprocess_env, api_world)
    store = api_world.container.stores.import_store
    role_id = seed.role(
        api_world.container.stores.identity_transactions,
        seed.company(api_world.container.stores.identity_transactions),
    )
    task_id, discarded_id = _failed_fanout_task(api_world), _failed_fanout_task(api_world)

    done = run_cli(env, "talent-import", "run", "--mode", "api-pull", "--json")
    run_id = json.loads(done.stdout)["runId"]
    commands = [
        ("talent-import", "replay-failed", run_id),
        ("talent-import", "replay-failed", "--consumer"),
        ("roles", "set-permissions", str(role_id), "deals.read"),
        ("fanout", "replay", task_id),
        ("fanout", "discard", discarded_id),
        ("maintenance", "prune", "--older-than", "30d"),
    ]
    answers = [done, *(run_cli(env, *command) for command in commands)]
    running = str(
        store.create_run(ImportRequest(ImportMode.API_PULL), uuid.uuid4(), SYSTEM_CLOCK.now()).run_id
    )
    answers += [run_cli(env, "talent-import", step, running) for step in ("reset-leases", "cancel")]

    assert [answer.returncode for answer in answers] == [0] * len(answers), [a.stderr for a in answers]
    audited = [_audit_lines(answer.stderr) for answer in answers]
    for lines in audited:
        print("cli audit line:", json.dumps(lines[0]))
    assert [[line["action"] for line in lines] for lines in audited] == [
        ["talent-import-run"],
        ["talent-import-replay-failed"],
        ["talent-sync-replay-failed"],
        ["set-role-permissions"],
        ["fanout-replay"],
        ["fanout-discard"],
        ["maintenance-prune"],
        ["talent-import-reset-leases"],
        ["talent-import-cancel"],
    ]
    assert {(lines[0]["who"], "client" in lines[0]) for lines in audited} == {
        (f"cli:{getpass.getuser()}", False)
    }
