"""`pin-identity kafka acls`: the ACL table as kafka-acls.sh commands, the text deploy/README.md shows."""

from __future__ import annotations

import re
from pathlib import Path

from tests.support.cli import run_cli, unconfigured_environment

README = Path(__file__).resolve().parents[2] / "deploy" / "README.md"


def test_the_printed_commands_are_the_deploy_readmes_and_grant_nothing_broader(tmp_path: Path) -> None:
    done = run_cli({**unconfigured_environment(), "PIN_IDENTITY_DATA_DIR": str(tmp_path)}, "kafka", "acls")
    assert done.returncode == 0, done.stderr
    section = README.read_text().split("### Kafka ACLs", 1)[1]
    shown = re.search(r"```sh\n(.*?)```", section, re.DOTALL)
    assert shown is not None
    assert shown.group(1) == done.stdout, "deploy/README.md: paste the output of `pin-identity kafka acls`"
    commands = [line for line in done.stdout.splitlines() if not line.startswith("#")]
    assert commands and all("--allow-principal User:pin-identity-" in line for line in commands)
    assert not any(word in done.stdout for word in ("--cluster", "'*'", " * ", "--operation All"))


def test_a_principal_and_talent_names_of_the_deployments_own(tmp_path: Path) -> None:
    env = {
        **unconfigured_environment(),
        "PIN_IDENTITY_DATA_DIR": str(tmp_path),
        "PIN_IDENTITY_TALENT_USERS_TOPIC": "staging.talent.users",
    }
    done = run_cli(env, "kafka", "acls", "--principal", "outbox-relay=User:relay-prod")
    assert done.returncode == 0, done.stderr
    assert "# outbox-relay: User:relay-prod" in done.stdout
    assert "--allow-principal User:relay-prod --operation Write" in done.stdout
    assert "--topic staging.talent.users" in done.stdout


def test_a_malformed_principal_is_one_line_and_exit_2(tmp_path: Path) -> None:
    env = {**unconfigured_environment(), "PIN_IDENTITY_DATA_DIR": str(tmp_path)}
    done = run_cli(env, "kafka", "acls", "--principal", "relay=relay-prod")
    assert done.returncode == 2
    assert "'relay=relay-prod' is not JOB=User:NAME with JOB one of topic-admin, outbox-relay" in done.stderr
    assert done.stdout == ""
