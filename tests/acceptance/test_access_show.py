"""`pin-identity access show` as a process: exit 0 for a matching or pending user, 1 for a drifted or missing
one, 2 (one line) for an unknown user, a broker that does not answer, or a partitioner nothing can be computed
for; `--json` is the HTTP API's document."""

from __future__ import annotations

import json
import uuid
from typing import Any
from uuid import UUID

import psycopg
import pytest

from pin_identity.adapters.kafka.partitioning import key_partition
from pin_identity.adapters.system_clock import SYSTEM_CLOCK
from pin_identity.composition import Container
from pin_identity.composition.stores import Stores
from pin_identity.operations import identity_changes
from pin_identity.operations.context import Context
from tests.support import seed
from tests.support.cli import run_cli
from tests.support.relay import publish_outbox

RANDOM_PARTITIONER = '{"partitioner": "random"}'


def _show(env: dict[str, str], user: UUID, *flags: str) -> tuple[int, str, str]:
    result = run_cli(env, "access", "show", str(user), *flags)
    assert "Traceback" not in result.stderr
    return result.returncode, result.stdout, result.stderr


def _document(env: dict[str, str], user: UUID) -> tuple[int, dict[str, Any]]:
    code, stdout, stderr = _show(env, user, "--json")
    assert stdout, stderr
    return code, json.loads(stdout)


def _granted(container: Container) -> tuple[UUID, UUID]:
    company = seed.company(container.stores.identity_transactions)
    role = seed.role(container.stores.identity_transactions, company)
    user = seed.user(container.stores.identity_transactions, company)
    return user, seed.grant(container.stores.identity_transactions, user, role, company)


def test_exit_status_follows_the_verdict(
    container: Container, stores: Stores, subprocess_env: dict[str, str], database_url: str
) -> None:
    matching, _ = _granted(container)
    drifted, drifted_grant = _granted(container)
    pending, pending_grant = _granted(container)
    missing = seed.user(stores.identity_transactions, seed.company(stores.identity_transactions))
    publish_outbox(container)
    with psycopg.connect(database_url) as conn:
        revoke = "UPDATE identity.role_assignments SET status = 'Revoked' WHERE id = %s"
        conn.execute(revoke, (drifted_grant,))
        role = conn.execute("SELECT role_id FROM identity.role_assignments LIMIT 1").fetchone()
        assert role is not None
        conn.execute(
            "INSERT INTO identity.role_assignments (id, role_id, user_id, scope_type)"
            " VALUES (%s, %s, %s, 'Platform')",
            (uuid.uuid4(), role[0], missing),
        )
    identity_changes.revoke_role_assignment(
        stores.identity_transactions, Context.fresh(SYSTEM_CLOCK), pending_grant
    )

    expected = {
        matching: (0, "matching"),
        pending: (0, "pending"),
        drifted: (1, "drifted"),
        missing: (1, "missing"),
    }
    for user, (status, verdict) in expected.items():
        code, document = _document(subprocess_env, user)
        assert (code, document["verdict"], document["userId"]) == (status, verdict, str(user))

    code, document = _document(subprocess_env, drifted)
    assert document["difference"]["onlyOnTopic"] == [str(drifted_grant)]
    assert document["lastEvent"]["changeReason"] == "RoleAssigned"
    assert {"partition", "offset", "version", "occurredAt", "eventId"} <= document["lastEvent"].keys()
    code, document = _document(subprocess_env, pending)
    assert [(e["changeReason"], e["version"]) for e in document["outbox"]] == [("RoleRevoked", 2)]


def test_the_table_names_the_verdict_the_event_and_what_waits(
    container: Container, stores: Stores, subprocess_env: dict[str, str], database_url: str
) -> None:
    user, grant = _granted(container)
    publish_outbox(container)
    code, stdout, _ = _show(subprocess_env, user)
    assert code == 0
    assert "verdict  matching" in stdout and str(grant) in stdout and "RoleAssigned" in stdout
    print(stdout)

    identity_changes.revoke_role_assignment(stores.identity_transactions, Context.fresh(SYSTEM_CLOCK), grant)
    code, stdout, _ = _show(subprocess_env, user)
    assert code == 0
    assert "verdict  pending" in stdout and "only on the topic" in stdout
    assert "access events waiting in the outbox" in stdout and "RoleRevoked" in stdout
    print(stdout)

    publish_outbox(container)
    granted = uuid.uuid4()  # behind the service's back: no event
    with psycopg.connect(database_url) as conn:
        conn.execute(
            "INSERT INTO identity.role_assignments (id, role_id, user_id, scope_type)"
            " SELECT %s, role_id, user_id, 'Platform' FROM identity.role_assignments WHERE id = %s",
            (granted, grant),
        )
    code, stdout, _ = _show(subprocess_env, user)
    assert code == 1
    assert "verdict  drifted" in stdout and str(granted) in stdout and "only in the database" in stdout
    print(stdout)


def test_an_unknown_user_is_2_in_one_line(subprocess_env: dict[str, str]) -> None:
    unknown = uuid.uuid4()
    code, stdout, stderr = _show(subprocess_env, unknown)
    assert (code, stdout) == (2, "")
    assert stderr.strip() == f"error: IDENTITY_NOT_FOUND: user {unknown} does not exist"


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"PIN_IDENTITY_KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:1"}, "PIN_IDENTITY_KAFKA_BOOTSTRAP_SERVERS:"),
        ({"PIN_IDENTITY_KAFKA_CONFIG": RANDOM_PARTITIONER}, "PIN_IDENTITY_KAFKA_CONFIG: partitioner"),
    ],
    ids=["unreachable-broker", "random-partitioner"],
)
def test_a_topic_that_cannot_be_searched_is_2_in_one_line(
    container: Container, subprocess_env: dict[str, str], env: dict[str, str], named: str
) -> None:
    user, _ = _granted(container)
    code, _, stderr = _show({**subprocess_env, **env}, user)
    lines = stderr.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith(f"error: {named}"), stderr


def test_a_supported_partitioner_in_the_config_is_followed(
    container: Container, subprocess_env: dict[str, str]
) -> None:
    """The relay and the search both read PIN_IDENTITY_KAFKA_CONFIG: murmur2 (the Java client's) here, for a
    user whose key murmur2 puts in another partition than the default's CRC-32 does."""
    user = next(
        user
        for user, _ in (_granted(container) for _ in range(50))
        if key_partition(str(user).encode(), 3, "murmur2") != key_partition(str(user).encode(), 3)
    )
    config = {"PIN_IDENTITY_KAFKA_CONFIG": '{"partitioner": "murmur2_random"}'}
    assert run_cli({**subprocess_env, **config}, "worker", "--jobs", "outbox-relay", "--once").returncode == 0
    code, document = _document({**subprocess_env, **config}, user)
    assert (code, document["verdict"]) == (0, "matching")
    code, document = _document(subprocess_env, user)  # searched where the default would have put it
    assert (code, document["verdict"], document["lastEvent"]) == (1, "missing", None)
