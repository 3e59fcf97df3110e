"""`pin-identity access audit` as a process, against a broker of its own (the audit reads the whole topic)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import psycopg
import pytest

from pin_identity.adapters.system_clock import SYSTEM_CLOCK
from pin_identity.composition import Container
from pin_identity.config import Settings
from pin_identity.operations import identity_changes
from pin_identity.operations.context import Context
from tests.support import seed
from tests.support.cli import run_cli
from tests.support.relay import publish_outbox


@pytest.fixture
def audited(settings: Settings, own_broker: str) -> Iterator[Container]:
    container = Container(settings.model_copy(update={"kafka_bootstrap_servers": own_broker}))
    container.connections.ensure_topics()
    yield container
    container.close()


def _audit(env: dict[str, str], broker: str) -> tuple[int, dict[str, object]]:
    result = run_cli({**env, "PIN_IDENTITY_KAFKA_BOOTSTRAP_SERVERS": broker}, "access", "audit", "--json")
    assert result.stdout, result.stderr
    return result.returncode, json.loads(result.stdout)


def _sql(database_url: str, statement: str, *params: object) -> None:
    with psycopg.connect(database_url) as conn:
        conn.execute(statement, params)


def test_the_audit_finds_matching_drifted_missing_and_pending_users(
    audited: Container, own_broker: str, subprocess_env: dict[str, str], database_url: str
) -> None:
    company = seed.company(audited.stores.identity_transactions)
    role = seed.role(audited.stores.identity_transactions, company)
    users = [seed.user(audited.stores.identity_transactions, company) for _ in range(4)]
    grants = [seed.grant(audited.stores.identity_transactions, user, role, company) for user in users]
    publish_outbox(audited)

    assert _audit(subprocess_env, own_broker) == (
        0,
        {
            "users": 4,
            "matching": 4,
            "drifted": 0,
            "missing": 0,
            "pending": 0,
            "examples": [],
            "incompletePartitions": [],
        },
    )

    # Behind the service's back (no event): a revoke, and a grant to a user who never had an access event.
    _sql(
        database_url,
        "UPDATE identity.role_assignments SET status = 'Revoked' WHERE id = %s",
        grants[0],
    )
    stranger = seed.user(audited.stores.identity_transactions, company)
    _sql(
        database_url,
        "INSERT INTO identity.role_assignments (id, role_id, user_id, company_id, scope_type)"
        " VALUES (%s, %s, %s, %s, 'Platform')",
        uuid.uuid4(),
        role,
        stranger,
        company,
    )
    # Through the service, not yet published: pending, whatever the topic says.
    identity_changes.revoke_role_assignment(
        audited.stores.identity_transactions, Context.fresh(SYSTEM_CLOCK), grants[1]
    )

    code, report = _audit(subprocess_env, own_broker)
    assert code == 1
    assert report == {
        "users": 5,
        "matching": 2,
        "drifted": 1,
        "missing": 1,
        "pending": 1,
        "examples": report["examples"],
        "incompletePartitions": [],
    }
    assert set(report["examples"]) == {str(users[0]), str(stranger)}  # type: ignore[arg-type]

    publish_outbox(audited)  # the pending revoke is published: it matches now
    code, report = _audit(subprocess_env, own_broker)
    assert (code, report["matching"], report["pending"]) == (1, 3, 0)


def test_the_table_on_a_terminal_less_run_says_converged(
    audited: Container, own_broker: str, subprocess_env: dict[str, str]
) -> None:
    company = seed.company(audited.stores.identity_transactions)
    role = seed.role(audited.stores.identity_transactions, company)
    seed.grant(
        audited.stores.identity_transactions,
        seed.user(audited.stores.identity_transactions, company),
        role,
        company,
    )
    publish_outbox(audited)
    result = run_cli(
        {**subprocess_env, "PIN_IDENTITY_KAFKA_BOOTSTRAP_SERVERS": own_broker}, "access", "audit"
    )
    assert result.returncode == 0, result.stderr
    assert "converged" in result.stdout and "NOT" not in result.stdout
