"""The stuck-import runbook's step for a holder of the run lock that is alive but hung, as an operator runs
it: `talent-import status` names the holder's backend pid, the runbook's statement ends that session, and a
`worker --jobs talent-import` takes the orchestration over and completes the run."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import psycopg
import pytest

from pin_identity.domain.import_run import RUN_LOCK_KEY, ImportMode, ImportRequest, ImportRun, RunStatus
from pin_identity.operations.action_log import Actor
from pin_identity.simulation.simulated_talent import generate_dataset
from tests.support.cli import CLI, run_cli
from tests.support.talent_import import TalentWorld
from tests.support.waiting import first_answer

pytestmark = pytest.mark.timeout(180)

RUNBOOK = Path(__file__).resolve().parents[2] / "docs" / "runbooks.md"


def _runbook_statement() -> str:
    """The statement the runbook's "import-stuck" section gives for a live but hung holder, with `<pid>`."""
    section = (
        RUNBOOK.read_text(encoding="utf-8").split('<a id="import-stuck"></a>', 1)[1].split("<a id=", 1)[0]
    )
    found = re.search(r"`(SELECT pg_terminate_backend\(<[^`]*>\))`", section)
    assert found, "the import-stuck runbook has no step for a live but hung holder of the run lock"
    return found.group(1)


def test_a_live_but_hung_lock_holder_is_ended_as_the_runbook_says_and_the_run_completes(
    subprocess_env: dict[str, str], api_world: TalentWorld, database_url: str
) -> None:
    statement = _runbook_statement()
    api_world.publish(generate_dataset(3, 6, seed=46))
    env = {
        **subprocess_env,
        "PIN_IDENTITY_TALENT_API_URL": api_world.api.url,
        "PIN_IDENTITY_TALENT_API_TOKEN": "talent-token",
        "PIN_IDENTITY_IMPORT_LOCK_RETRY_S": "0.5",
    }
    admin = api_world.container.use_cases.imports
    run = admin.start(ImportRequest(ImportMode.API_PULL, page_size=2), who=Actor("test"))
    # The orchestrator that hangs: its session holds the run lock and does nothing more, as a process stuck
    # in a call would (its process alive, so the lock is never released by itself).
    hung = psycopg.connect(database_url, autocommit=True, application_name="pin-identity (hung)")
    hung.execute("SELECT pg_advisory_lock(hashtextextended(%s, 0))", [RUN_LOCK_KEY])
    try:
        worker = subprocess.Popen(
            [*CLI, "worker", "--jobs", "talent-import"], env=env, stderr=subprocess.PIPE, text=True
        )
        try:
            status = run_cli(env, "talent-import", "status", "--json")
            assert status.returncode == 0, status.stderr
            holder = json.loads(status.stdout)["lockHolder"]
            assert holder.startswith("pin-identity (hung)"), holder
            pid = int(re.search(r"backend pid (\d+)", holder).group(1))  # type: ignore[union-attr]
            assert pid == hung.info.backend_pid

            with psycopg.connect(database_url, autocommit=True) as operator:
                operator.execute(re.sub(r"<[^>]*>", str(pid), statement))

            def ended_run() -> ImportRun | None:
                current = admin.existing_run(run.run_id)
                return None if current.status is RunStatus.RUNNING else current

            ended = first_answer(ended_run, "the run ended", timeout_s=90)
            assert ended.status is RunStatus.COMPLETED
            assert (ended.companies.applied, ended.users.applied) == (3, 6)
        finally:
            worker.terminate()
            _, stderr = worker.communicate(timeout=30)
        assert '"event": "import-orchestration-taken"' in stderr
        with pytest.raises(psycopg.OperationalError):  # the hung session was the one ended
            hung.execute("SELECT 1")
    finally:
        hung.close()
