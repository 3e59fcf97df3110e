"""The replica apply logic on real PostgreSQL: writes, events, quarantine, batches."""

from __future__ import annotations

import json
import uuid
from datetime import timedelta
from typing import Any
from uuid import UUID

from pin_identity.adapters.system_clock import SYSTEM_CLOCK
from pin_identity.adapters.talent_wire import read_item
from pin_identity.composition import Container
from pin_identity.composition.stores import Stores
from pin_identity.domain.talent import ImportStage, ItemResult, SyncErrorCode
from pin_identity.operations.action_log import Actor
from pin_identity.operations.context import Context
from pin_identity.operations.ports.replica import SourceItem
from pin_identity.operations.talent_replica import ApplyOptions, apply_snapshots, retry_deferred
from tests.support import seed, talent
from tests.support.memory_talent import MemoryDryRun
from tests.support.phones import written_phone
from tests.support.schemas import validate_event


def _rows(container: Container, sql: Any, params: Any = None) -> list[tuple[Any, ...]]:
    with container.connections.database.connection() as conn:
        return conn.execute(sql, params).fetchall()


def test_a_new_manager_gets_exactly_one_default_role_and_three_events(container: Container) -> None:
    company = talent.tenant()
    manager = talent.user(company["tenantId"])
    talent.tenants(container, company)

    outcome = talent.users(container, manager)
    again = talent.users(container, manager)

    assert (outcome.applied, again.skipped) == (1, 1)
    [user] = talent.replica_state(container)["users"]
    assert user[2:4] == ("DeveloperManager", "Invited")
    assert user[-1] == [f"developer-manager@{company['tenantId']}"]
    events = talent.outbox_events(container)
    assert [e["eventType"] for e in events] == ["CompanyUpserted", "UserUpserted", "UserAccessChanged"]
    access = events[2]["payload"]
    assert (access["changeReason"], access["version"], access["userId"]) == (
        "RoleAssigned",
        1,
        manager["userId"],
    )
    assert [a["scopeType"] for a in access["activeAssignments"]] == ["Organization"]
    for (value,) in _rows(container, "SELECT value FROM identity.outbox_events"):
        validate_event(json.loads(value))


def test_a_phone_of_an_existing_investor_is_quarantined_not_merged(
    container: Container, stores: Stores
) -> None:
    company = talent.tenant()
    talent.tenants(container, company)
    investor = seed.user(stores.identity_transactions)
    [(phone,)] = _rows(container, "SELECT phone FROM identity.users WHERE id = %s", [investor])
    manager = talent.user(company["tenantId"], phone=phone)

    outcome = talent.users(container, manager)

    assert [o.error for o in outcome.outcomes] == [SyncErrorCode.PHONE_CONFLICT]
    quarantined = _rows(
        container,
        "SELECT run_id, stage, external_id::text, error_code, payload"
        " FROM identity.talent_import_failed_items",
    )
    assert quarantined == [(None, "Users", manager["userId"], "IDENTITY_SYNC_PHONE_CONFLICT", manager)]
    assert _rows(container, "SELECT sync_source FROM identity.users") == [
        ("Local",)
    ]  # untouched, no second user


def test_poison_items_never_fail_their_batch(container: Container) -> None:
    company = talent.tenant()
    talent.tenants(container, company)
    first, second = talent.user(company["tenantId"]), talent.user(company["tenantId"])
    records = [
        talent.raw(first),
        talent.raw(talent.user(company["tenantId"], phone="not-a-phone")),
        read_item(ImportStage.USERS, None, "{not json"),
        talent.raw(talent.user(company["tenantId"], phone=first["phone"])),
        talent.raw(talent.user(str(uuid.uuid4()))),
        talent.raw(second),
    ]

    outcome = talent.apply(container, ImportStage.USERS, records)

    assert [o.result for o in outcome.outcomes].count(ItemResult.APPLIED) == 2
    assert sorted(o.error for o in outcome.outcomes if o.error) == sorted(
        [
            SyncErrorCode.INVALID_PAYLOAD,
            SyncErrorCode.INVALID_PAYLOAD,
            SyncErrorCode.PHONE_CONFLICT,
            SyncErrorCode.COMPANY_NOT_FOUND,
        ]
    )
    assert _rows(container, "SELECT count(*) FROM identity.talent_import_failed_items") == [(4,)]


def test_tenant_rules_unknown_type_immutable_type_and_deletion(container: Container) -> None:
    company = talent.tenant()
    talent.tenants(container, company)

    unknown = talent.tenants(container, talent.tenant(company_type="Cooperative"))
    immutable = talent.tenants(container, {**company, "version": 2, "companyType": "Bank"})
    deleted = talent.apply(
        container, ImportStage.TENANTS, [talent.tombstone(ImportStage.TENANTS, company["tenantId"])]
    )
    absent = talent.apply(
        container, ImportStage.TENANTS, [talent.tombstone(ImportStage.TENANTS, str(uuid.uuid4()))]
    )

    assert [o.error for o in unknown.outcomes] == [SyncErrorCode.UNKNOWN_COMPANY_TYPE]
    assert [o.error for o in immutable.outcomes] == [SyncErrorCode.COMPANY_TYPE_IMMUTABLE]
    assert (deleted.applied, absent.skipped) == (1, 1)
    assert [row[2:4] for row in talent.replica_state(container)["companies"]] == [("Developer", "Blocked")]


def test_a_deleted_manager_is_blocked_and_loses_every_active_role(
    container: Container, stores: Stores
) -> None:
    company = talent.tenant()
    manager = talent.user(company["tenantId"])
    talent.tenants(container, company)
    talent.users(container, manager)
    [(user_id, company_id)] = _rows(container, "SELECT id, company_id FROM identity.users")
    extra_role = seed.role(stores.identity_transactions, company_id)
    seed.grant(stores.identity_transactions, user_id, extra_role, company_id)

    outcome = talent.users(container, {**manager, "version": 2, "isDeleted": True})

    assert outcome.applied == 1
    assert _rows(container, "SELECT status FROM identity.users") == [("Blocked",)]
    assert _rows(container, "SELECT count(*) FROM identity.role_assignments WHERE status = 'Active'") == [
        (0,)
    ]
    revoked = [
        e for e in talent.outbox_events(container) if e["payload"].get("changeReason") == "RoleRevoked"
    ]
    assert sorted(e["payload"]["changedRoleId"] for e in revoked) == sorted(
        ["00000000-0000-4000-8000-000000000001", str(extra_role)]
    )
    assert all(e["payload"]["activeAssignments"] == [] for e in revoked)


def test_a_manager_moving_tenant_takes_the_default_role_along(container: Container) -> None:
    old, new = talent.tenant(), talent.tenant()
    manager = talent.user(old["tenantId"])
    talent.tenants(container, old, new)
    talent.users(container, manager)

    talent.users(container, {**manager, "version": 2, "tenantId": new["tenantId"]})

    [user] = talent.replica_state(container)["users"]
    assert (user[1], user[-1]) == (new["tenantId"], [f"developer-manager@{new['tenantId']}"])


def test_phones_swapped_inside_one_batch_apply_in_order(container: Container) -> None:
    company = talent.tenant()
    talent.tenants(container, company)
    leaving = talent.user(company["tenantId"])
    talent.users(container, leaving)
    newcomer = talent.user(company["tenantId"], phone=leaving["phone"])

    # The newcomer takes the phone the other user gives up earlier in the same batch: the bulk write meets the
    # unique index first, and the round is replayed item by item.
    outcome = talent.users(container, {**leaving, "version": 2, "phone": written_phone()}, newcomer)

    assert outcome.applied == 2
    assert len(talent.replica_state(container)["users"]) == 2


def test_a_dry_run_decides_and_counts_but_writes_nothing(container: Container) -> None:
    company = talent.tenant()
    manager = talent.user(company["tenantId"])
    options = ApplyOptions(dry_run=True, memory=MemoryDryRun())

    tenants = talent.apply(container, ImportStage.TENANTS, [talent.raw(company)], options)
    users = talent.apply(
        container, ImportStage.USERS, [talent.raw(manager), talent.raw(talent.user("x"))], options
    )

    assert (tenants.applied, users.applied, users.failed) == (1, 1, 1)
    assert talent.replica_state(container) == {"companies": [], "users": []}
    assert _rows(container, "SELECT count(*) FROM identity.outbox_events") == [(0,)]
    assert _rows(container, "SELECT count(*) FROM identity.talent_import_failed_items") == [(0,)]


def test_the_same_failure_seen_twice_by_the_consumer_is_kept_once(container: Container) -> None:
    poison = talent.raw(talent.tenant(company_type="Cooperative"))
    talent.apply(container, ImportStage.TENANTS, [poison])
    talent.apply(container, ImportStage.TENANTS, [poison])
    assert _rows(container, "SELECT count(*) FROM identity.talent_import_failed_items") == [(1,)]


def test_a_batch_is_one_transaction_even_with_its_savepoints(container: Container, stores: Stores) -> None:
    company = talent.tenant()
    with stores.replica_transactions() as tx:
        apply_snapshots(tx, [SourceItem(talent.raw(company))], Context.fresh(SYSTEM_CLOCK), ApplyOptions())
        # left without commit(): the consumer's failed batch, whose offsets are not committed either
    assert talent.replica_state(container) == {"companies": [], "users": []}
    assert _rows(container, "SELECT count(*) FROM identity.outbox_events") == [(0,)]


def test_text_postgresql_cannot_store_is_quarantined_not_fatal(container: Container) -> None:
    company = talent.tenant()
    talent.tenants(container, company)
    good = talent.user(company["tenantId"])

    outcome = talent.users(container, talent.user(company["tenantId"], firstName="Iv\x00an"), good)

    assert [o.error for o in outcome.outcomes] == [SyncErrorCode.INVALID_PAYLOAD, None]
    [(payload,)] = _rows(container, "SELECT payload FROM identity.talent_import_failed_items")
    assert payload["firstName"] == "Iv\ufffdan"


def test_a_quarantined_item_keeps_its_reason_in_words_without_the_value(container: Container) -> None:
    company = talent.tenant()
    talent.tenants(container, company)
    manager = talent.user(company["tenantId"], phone="+7 000 not a phone")

    talent.users(container, manager)

    [(code, reason)] = _rows(container, "SELECT error_code, reason FROM identity.talent_import_failed_items")
    assert (code, reason) == ("IDENTITY_SYNC_INVALID_PAYLOAD", "phone: not a valid phone number")
    assert "000" not in reason


def _access(container: Container, since: int) -> list[tuple[str, str, int]]:
    events = [e for e in talent.outbox_events(container)[since:] if e["eventType"] == "UserAccessChanged"]
    return [
        (e["payload"]["userId"], e["payload"]["changeReason"], len(e["payload"]["activeAssignments"]))
        for e in events
    ]


def test_a_manager_holds_its_default_role_only_while_its_company_is_not_blocked(container: Container) -> None:
    company, other = talent.tenant(), talent.tenant()
    talent.tenants(container, company, other)
    manager = talent.user(company["tenantId"])
    talent.users(container, manager)
    roles = {u[0]: u[-1] for u in talent.replica_state(container)["users"]}
    assert roles[manager["userId"]] == [f"developer-manager@{company['tenantId']}"]

    before = len(talent.outbox_events(container))
    talent.tenants(container, {**company, "version": 2, "isDeleted": True})
    assert _access(container, before) == [(manager["userId"], "RoleRevoked", 0)]

    newcomer = talent.user(company["tenantId"])
    mover = talent.user(other["tenantId"])
    talent.users(container, mover)
    before = len(talent.outbox_events(container))
    talent.users(container, newcomer, {**mover, "version": 2, "tenantId": company["tenantId"]})
    # The newcomer never had access (no access event); the mover lost its default role.
    assert _access(container, before) == [(mover["userId"], "RoleRevoked", 0)]

    before = len(talent.outbox_events(container))
    talent.tenants(container, {**company, "version": 3})  # the company comes back: so do its managers' roles
    granted = sorted(_access(container, before))
    assert granted == sorted((u["userId"], "RoleAssigned", 1) for u in (manager, newcomer, mover))
    roles = {u[0]: u[-1] for u in talent.replica_state(container)["users"]}
    assert set(map(tuple, roles.values())) == {(f"developer-manager@{company['tenantId']}",)}


# ---------------------------------------------------------------- the quarantine: pruned, deleted, replayed

OPERATOR = Actor("cli:olga")


def _change(container: Container, sql: Any, params: Any = None) -> None:
    with container.connections.database.connection() as conn:
        conn.execute(sql, params)


_HOLDER = (
    "SELECT u.status, (SELECT count(*) FROM identity.role_assignments ra"
    " WHERE ra.user_id = u.id AND ra.status = 'Active') FROM identity.users u"
    " WHERE u.external_talent_user_id = %s"
)


def _manager_with_a_quarantined_update(container: Container, stores: Stores) -> tuple[dict[str, Any], UUID]:
    """A Talent manager (Invited, its default role Active) whose update (version 2) took a local investor's
    phone: the consumer quarantined it (IDENTITY_SYNC_PHONE_CONFLICT). The investor's id beside it."""
    company = talent.tenant()
    manager = talent.user(company["tenantId"])
    talent.tenants(container, company)
    talent.users(container, manager)
    investor = seed.user(stores.identity_transactions)
    [(phone,)] = _rows(container, "SELECT phone FROM identity.users WHERE id = %s", [investor])
    outcome = talent.users(container, {**manager, "version": 2, "phone": phone})
    assert [o.error for o in outcome.outcomes] == [SyncErrorCode.PHONE_CONFLICT]
    return manager, investor


def test_a_pruned_quarantine_item_is_reported_not_replayable_and_never_applied_as_a_deletion(
    container: Container, stores: Stores
) -> None:
    manager, _ = _manager_with_a_quarantined_update(container, stores)
    _change(
        container, "UPDATE identity.talent_import_failed_items SET created_at = now() - interval '40 days'"
    )
    pruned = container.use_cases.retention.prune(timedelta(days=30), who=OPERATOR)
    events = "SELECT count(*) FROM identity.outbox_events"
    before = _rows(container, events)

    replayed = container.use_cases.imports.replay_failed(None, None, who=OPERATOR)

    assert pruned.quarantine_payloads == 1
    assert (replayed.applied, replayed.skipped, replayed.failed, replayed.not_replayable) == (0, 0, 0, 1)
    assert _rows(container, _HOLDER, [manager["userId"]]) == [("Invited", 1)]  # not Blocked, the role kept
    assert _rows(container, events) == before  # no RoleRevoked, nothing at all
    assert _rows(container, "SELECT count(*) FROM identity.talent_import_failed_items") == [(1,)]  # kept


def test_a_tombstone_drops_every_quarantined_snapshot_so_a_replay_cannot_bring_the_user_back(
    container: Container, stores: Stores
) -> None:
    """The operator-held update of a present manager, and the quarantined creation of an absent one: the
    tombstones remove both, so the runbook's replay after the phones were freed restores nobody."""
    manager, investor = _manager_with_a_quarantined_update(container, stores)
    [(phone,)] = _rows(container, "SELECT phone FROM identity.users WHERE id = %s", [investor])
    never_created = talent.user(manager["tenantId"], phone=phone)
    assert [o.error for o in talent.users(container, never_created).outcomes] == [
        SyncErrorCode.PHONE_CONFLICT
    ]

    talent.apply(
        container,
        ImportStage.USERS,
        [
            talent.tombstone(ImportStage.USERS, manager["userId"]),
            talent.tombstone(ImportStage.USERS, never_created["userId"]),
        ],
    )
    _change(container, "UPDATE identity.users SET phone = '+79990000000' WHERE id = %s", [investor])  # fixed
    replayed = container.use_cases.imports.replay_failed(None, None, who=OPERATOR)

    assert (replayed.applied, replayed.failed) == (0, 0)
    assert _rows(container, _HOLDER, [manager["userId"]]) == [("Blocked", 0)]
    assert _rows(container, _HOLDER, [never_created["userId"]]) == []
    assert _rows(container, "SELECT count(*) FROM identity.talent_import_failed_items") == [(0,)]


def test_a_replay_of_the_consumers_quarantine_keeps_a_user_waiting_for_its_tenant_deferred(
    container: Container,
) -> None:
    company = talent.tenant()
    manager = talent.user(company["tenantId"])
    deferring = ApplyOptions(retry_at=lambda attempt: SYSTEM_CLOCK.now() + timedelta(seconds=attempt))
    talent.apply(container, ImportStage.USERS, [talent.raw(manager)], deferring)

    replayed = container.use_cases.imports.replay_failed(
        None, None, who=OPERATOR
    )  # the tenant is still absent
    talent.tenants(container, company)  # it arrives: the consumer's next step retries what waits for it
    with container.stores.replica_transactions() as tx:
        retried = retry_deferred(tx, Context.fresh(SYSTEM_CLOCK), deferring, 100)
        tx.commit()

    assert (replayed.applied, replayed.failed) == (0, 1)
    assert retried.applied == 1
    assert _rows(container, _HOLDER, [manager["userId"]]) == [("Invited", 1)]
