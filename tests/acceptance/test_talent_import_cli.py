"""`pin-identity talent-import` as operators run it: separate processes, exit statuses, crashes, cancels."""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Callable
from typing import Any

import pytest

from pin_identity.composition import Container
from pin_identity.simulation.simulated_talent import SimulatedTalentApi, generate_dataset
from tests.support import talent
from tests.support.cli import CLI, run_cli
from tests.support.talent import TalentTopics
from tests.support.talent_import import TalentWorld
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(240)


@pytest.fixture
def env(
    subprocess_env: dict[str, str], talent_api: SimulatedTalentApi, talent_topics: TalentTopics
) -> dict[str, str]:
    return {
        **subprocess_env,
        "PIN_IDENTITY_TALENT_API_URL": talent_api.url,
        "PIN_IDENTITY_TALENT_API_TOKEN": "talent-token",
        "PIN_IDENTITY_TALENT_TENANTS_TOPIC": talent_topics.tenants,
        "PIN_IDENTITY_TALENT_USERS_TOPIC": talent_topics.users,
        "PIN_IDENTITY_TALENT_SYNC_GROUP": talent_topics.group,
    }


def _start(env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([*CLI, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _rows(container: Container, sql: Any, params: Any = None) -> list[tuple[Any, ...]]:
    with container.connections.database.connection() as conn:
        return conn.execute(sql, params).fetchall()


def _hold_once(world: TalentWorld, condition: Callable[[], bool]) -> None:
    """When `condition` holds, stop Talent answering, and wait until the run is waiting on it: whatever the
    test does next (kill, cancel, SIGTERM) lands in the middle of the run, however fast the machine."""
    wait_until(condition, "the run reached the point under test", timeout_s=60)
    world.api.hold_after(0)
    wait_until(lambda: world.api.held >= 1, "the run waits on Talent", timeout_s=60)


def _done_pages(container: Container, stage: str) -> int:
    """Done pages of the Running run."""
    [(count,)] = _rows(
        container,
        "SELECT count(*) FROM identity.talent_import_pages p"
        " JOIN identity.talent_import_runs r ON r.id = p.run_id"
        " WHERE r.status = 'Running' AND p.stage = %s AND p.status = 'Done'",
        [stage],
    )
    return int(count)


def _pool_connections(container: Container) -> int:
    [(count,)] = _rows(
        container,
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        " AND application_name = 'pin-identity'",
    )
    return int(count)


def test_a_run_prints_the_result_and_a_second_run_meanwhile_is_refused_with_3(
    env: dict[str, str], api_world: TalentWorld
) -> None:
    api_world.publish(generate_dataset(10, 40, seed=31))
    api_world.api.hold_after(6)  # health, count, then planning and reading: the run holds the lock
    first = _start(env, "talent-import", "run", "--mode", "api-pull", "--page-size", "4", "--json")
    wait_until(lambda: api_world.api.held >= 1, "the first run waits on Talent", timeout_s=60)

    second = run_cli(env, "talent-import", "run", "--mode", "api-pull", "--page-size", "4")
    status = run_cli(env, "talent-import", "status", "--json")
    api_world.api.release()
    out, err = first.communicate(timeout=120)

    assert second.returncode == 3
    assert second.stderr.strip().splitlines()[-1].startswith("error: IDENTITY_IMPORT_ALREADY_RUNNING")
    assert json.loads(status.stdout)["lockHolder"].startswith("pin-identity talent-import")
    assert first.returncode == 0, err[-2000:]
    result = json.loads(out)
    assert (result["status"], result["mode"], result["dryRun"]) == ("Completed", "ApiPull", False)
    assert result["companies"] == {"planned": 10, "applied": 10, "skipped": 0, "failed": 0}
    assert result["users"] == {"planned": 40, "applied": 40, "skipped": 0, "failed": 0}


@pytest.mark.parametrize(
    ("args", "code"),
    [
        (("--mode", "sideways"), 2),
        (("--mode", "api-pull", "--page-size", "0"), 2),
        (("--mode", "api-pull", "--page-size", "2001"), 2),
        (("--mode", "api-pull", "--tenant", "not-a-uuid"), 2),
    ],
)
def test_bad_requests_exit_2_with_one_line(env: dict[str, str], args: tuple[str, ...], code: int) -> None:
    result = run_cli(env, "talent-import", "run", *args)
    assert result.returncode == code
    assert result.stderr.strip().splitlines()[-1].startswith("error: ")
    assert "Traceback" not in result.stderr


def test_an_unavailable_or_rejecting_source_exits_4_before_writing(
    env: dict[str, str], api_world: TalentWorld
) -> None:
    api_world.api.healthy = False
    down = run_cli(env, "talent-import", "run", "--mode", "api-pull")
    api_world.api.healthy = True
    rejected = run_cli(
        {**env, "PIN_IDENTITY_TALENT_API_TOKEN": "wrong"}, "talent-import", "run", "--mode", "api-pull"
    )

    for result in (down, rejected):
        assert result.returncode == 4
        assert "IDENTITY_IMPORT_SOURCE_UNAVAILABLE" in result.stderr.strip().splitlines()[-1]
    assert _rows(api_world.container, "SELECT count(*) FROM identity.talent_import_runs") == [(0,)]


def test_a_killed_run_resumes_only_with_the_same_options_and_ends_as_an_uninterrupted_one(
    env: dict[str, str], api_world: TalentWorld, another_database: Callable[[], str]
) -> None:
    dataset = generate_dataset(30, 60, seed=32)
    api_world.publish(dataset)
    crashing = {**env, "PIN_IDENTITY_IMPORT_PAGE_LEASE_S": "1"}
    args = ("talent-import", "run", "--mode", "api-pull", "--page-size", "3", "--json")

    for stage in ("Tenants", "Users"):  # SIGKILL once in each stage
        runner = _start(crashing, *args)
        before = _done_pages(api_world.container, stage)
        _hold_once(
            api_world, lambda stage=stage, before=before: _done_pages(api_world.container, stage) > before
        )
        assert _done_pages(api_world.container, stage) < 10  # the stage (10 pages each) is not over
        runner.send_signal(signal.SIGKILL)
        runner.wait(timeout=10)
        api_world.api.release()
        wait_until(lambda: api_world.container.stores.run_lock().holder() is None, "the dead session is gone")
        if stage == "Tenants":
            mismatch = run_cli(env, "talent-import", "run", "--mode", "topic-replay")
            assert mismatch.returncode == 2
            assert "IDENTITY_IMPORT_RESUME_MISMATCH" in mismatch.stderr
    done_before = _rows(
        api_world.container, "SELECT id, updated_at FROM identity.talent_import_pages WHERE status = 'Done'"
    )
    final = run_cli(env, *args, timeout=120)

    assert final.returncode == 0, final.stderr[-2000:]
    result = json.loads(final.stdout)
    assert (result["companies"]["applied"], result["users"]["applied"]) == (30, 60)
    after = dict(_rows(api_world.container, "SELECT id, updated_at FROM identity.talent_import_pages"))
    assert all(after[page] == updated for page, updated in done_before)  # Done pages were not applied again
    reference = TalentWorld(
        api_world.mode,
        api_world.settings.model_copy(update={"database_url": another_database()}),
        api_world.api,
        api_world.topics,
    )
    reference.run(page_size=3)
    assert talent.replica_state(api_world.container) == talent.replica_state(reference.container)
    assert len(talent.outbox_events(api_world.container)) == len(talent.outbox_events(reference.container))
    reference.close()


def test_two_workers_and_the_runner_apply_every_page_exactly_once(
    env: dict[str, str], api_world: TalentWorld
) -> None:
    api_world.publish(generate_dataset(20, 200, seed=33))
    api_world.api.delay_s = 0.05
    connected = _pool_connections(api_world.container)
    workers = [_start(env, "worker", "--jobs", "talent-import") for _ in range(2)]
    wait_until(lambda: _pool_connections(api_world.container) >= connected + 2, "both workers are up")
    try:
        runner = run_cli(
            env, "talent-import", "run", "--mode", "api-pull", "--page-size", "5", "--json", timeout=180
        )
    finally:
        for worker in workers:
            worker.send_signal(signal.SIGTERM)
        logs = [worker.communicate(timeout=30)[1] for worker in workers]

    assert runner.returncode == 0, runner.stderr[-2000:]
    pages = _rows(
        api_world.container, "SELECT status, attempt_count, items_applied FROM identity.talent_import_pages"
    )
    assert {(status, attempts) for status, attempts, _ in pages} == {("Done", 1)}
    assert sum(applied for _, _, applied in pages) == 220
    assert len(talent.outbox_events(api_world.container)) == 20 + 200 * 2
    applied_by_workers = sum(log.count('"page-applied"') for log in logs)
    assert applied_by_workers > 0, [
        log[-3000:] for log in logs
    ]  # the workers took pages, not just the runner
    assert all(worker.returncode == 0 for worker in workers)


def test_a_cancel_and_ctrl_c_cancel_the_run_after_the_current_page_with_exit_5(
    env: dict[str, str], api_world: TalentWorld
) -> None:
    api_world.publish(generate_dataset(30, 0, seed=34))
    args = ("talent-import", "run", "--mode", "api-pull", "--page-size", "2", "--json")

    runner = _start(env, *args)
    _hold_once(api_world, lambda: _done_pages(api_world.container, "Tenants") >= 1)
    [(run_id,)] = _rows(
        api_world.container, "SELECT id FROM identity.talent_import_runs WHERE status = 'Running'"
    )
    cancelled = run_cli(env, "talent-import", "cancel", str(run_id))
    api_world.api.release()
    out, _ = runner.communicate(timeout=60)
    assert (cancelled.returncode, runner.returncode, json.loads(out)["status"]) == (0, 5, "Cancelled")

    second = _start(env, *args)
    _hold_once(api_world, lambda: _done_pages(api_world.container, "Tenants") >= 3)
    second.send_signal(signal.SIGINT)
    api_world.api.release()
    out, _ = second.communicate(timeout=60)
    assert (second.returncode, json.loads(out)["status"]) == (5, "Cancelled")
    done = _rows(
        api_world.container, "SELECT count(*) FROM identity.talent_import_pages WHERE status = 'Done'"
    )
    assert done[0][0] >= 3  # Done pages are kept


def test_sigterm_leaves_the_run_running_without_leases_and_the_next_run_resumes_it(
    env: dict[str, str], api_world: TalentWorld
) -> None:
    """A Kubernetes eviction or a drained node: the pod gets SIGTERM. The run is not the operator's to end:
    after its current page the process lets go of the run (its lock, no page held) and exits 143, and the
    Job's next pod, running the same command, resumes the run to its end."""
    api_world.publish(generate_dataset(30, 60, seed=35))
    args = ("talent-import", "run", "--mode", "api-pull", "--page-size", "3", "--json")

    drained = _start(env, *args)
    _hold_once(api_world, lambda: _done_pages(api_world.container, "Users") >= 2)
    drained.send_signal(signal.SIGTERM)
    api_world.api.release()
    out, err = drained.communicate(timeout=60)
    [(run_id, status)] = _rows(api_world.container, "SELECT id, status FROM identity.talent_import_runs")
    held = _rows(
        api_world.container, "SELECT count(*) FROM identity.talent_import_pages WHERE status = 'InProgress'"
    )
    lock_holder = api_world.container.stores.run_lock().holder()
    resumed = run_cli(env, *args, timeout=120)

    assert (drained.returncode, out, status, held, lock_holder) == (143, "", "Running", [(0,)], None), err
    assert f"run {run_id} stopped after its current page and left Running" in err
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    result = json.loads(resumed.stdout)
    assert (result["runId"], result["status"]) == (str(run_id), "Completed")
    assert (result["companies"]["applied"], result["users"]["applied"]) == (30, 60)  # the whole run's counts
