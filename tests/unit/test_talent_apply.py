"""The replica use case (apply_snapshots, replay_quarantined) over an in-memory replica: stages in order,
rounds, the savepoint replay of a conflict, the quarantine, the dry run, managers following their company."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from uuid import UUID

import pytest

from pin_identity.adapters.talent_wire import read_item
from pin_identity.domain.errors import NotFoundError
from pin_identity.domain.talent import Change, ImportStage, ItemResult, SyncErrorCode, TalentItem
from pin_identity.operations.context import Context
from pin_identity.operations.ports.replica import SourceItem
from pin_identity.operations.talent_replica import (
    ApplyOptions,
    BatchOutcome,
    apply_snapshots,
    replay_quarantined,
    retry_deferred,
)
from tests.support.memory_talent import DEFAULT_ROLE, MemoryDryRun, MemoryReplica, tenant_item, user_item

NOW = datetime(2026, 12, 1, tzinfo=UTC)


def _apply(replica: MemoryReplica, *items: TalentItem, options: ApplyOptions | None = None) -> BatchOutcome:
    with replica() as tx:
        batch = apply_snapshots(
            tx, [SourceItem(i) for i in items], Context(uuid.uuid4(), NOW), options or ApplyOptions()
        )
        tx.commit()
    return batch


def _results(batch: BatchOutcome) -> list[tuple[ImportStage, ItemResult, Change | SyncErrorCode | None]]:
    return [(o.stage, o.result, o.change or o.error) for o in batch.outcomes]


def test_a_batch_applies_its_tenants_before_its_users_each_stage_locked_before_its_rounds() -> None:
    replica, tenant = MemoryReplica(), uuid.uuid4()
    manager = user_item(tenant)

    batch = _apply(replica, manager, tenant_item(tenant))

    assert _results(batch) == [
        (ImportStage.TENANTS, ItemResult.APPLIED, Change.CREATED),
        (ImportStage.USERS, ItemResult.APPLIED, Change.CREATED),
    ]
    assert replica.locks == [("Tenants", [tenant]), ("Users", [manager.talent_id])]
    user = replica.state.users[manager.talent_id]  # type: ignore[index]
    assert user.company_id == replica.state.companies[tenant].company_id
    assert replica.state.roles[user.user_id] == {DEFAULT_ROLE.role_id}
    assert replica.state.event_types() == ["CompanyUpserted", "UserUpserted", "UserAccessChanged"]


def test_an_entity_twice_in_a_batch_is_applied_in_rounds_and_an_older_version_is_stale() -> None:
    replica, tenant = MemoryReplica(), uuid.uuid4()

    batch = _apply(replica, tenant_item(tenant, version=1), tenant_item(tenant, version=3, name="New"))
    again = _apply(replica, tenant_item(tenant, version=2))

    assert [o.change for o in batch.outcomes] == [Change.CREATED, Change.UPDATED]
    assert (replica.state.companies[tenant].name, replica.state.companies[tenant].replica_version) == (
        "New",
        3,
    )
    assert [(o.result, o.stale) for o in again.outcomes] == [(ItemResult.SKIPPED, True)]


def test_a_poison_item_is_quarantined_with_its_reason_and_the_items_around_it_apply() -> None:
    replica = MemoryReplica()
    poison = read_item(ImportStage.TENANTS, str(uuid.uuid4()), {"tenantId": "x", "version": 1})

    batch = _apply(replica, tenant_item(), poison, tenant_item(companyType="Shop"), tenant_item())

    assert [o.result for o in batch.outcomes].count(ItemResult.APPLIED) == 2
    assert sorted(o.error for o in batch.outcomes if o.error) == [
        SyncErrorCode.INVALID_PAYLOAD,
        SyncErrorCode.UNKNOWN_COMPANY_TYPE,
    ]
    [invalid] = [
        e for e in replica.state.quarantine.values() if e.error_code == SyncErrorCode.INVALID_PAYLOAD
    ]
    assert (invalid.external_id, invalid.payload, invalid.reason) == (
        poison.talent_id,
        poison.payload,
        "tenantId is not a uuid",
    )


def test_a_conflict_the_reads_could_not_foresee_replays_the_round_item_by_item() -> None:
    replica, tenant = MemoryReplica(), uuid.uuid4()
    _apply(replica, tenant_item(tenant))
    taken = user_item(tenant)
    replica.concurrent_phones.add(taken.payload["phone"])

    batch = _apply(replica, user_item(tenant), taken, user_item(tenant))

    assert [o.result for o in batch.outcomes] == [ItemResult.APPLIED, ItemResult.FAILED, ItemResult.APPLIED]
    assert batch.outcomes[1].error is SyncErrorCode.PHONE_CONFLICT
    assert len(replica.state.users) == 2 and len(replica.state.quarantine) == 1


def test_a_dry_run_writes_nothing_and_remembers_what_it_would_have_written() -> None:
    replica, tenant, memory = MemoryReplica(), uuid.uuid4(), MemoryDryRun()
    manager = user_item(tenant)
    options = ApplyOptions(run_id=uuid.uuid4(), dry_run=True, memory=memory)

    tenants = _apply(replica, tenant_item(tenant), options=options)
    users = _apply(replica, manager, user_item(uuid.uuid4()), options=options)

    assert (tenants.applied, users.applied, users.failed) == (1, 1, 1)  # its tenant is "there" for the user
    assert (replica.state.companies, replica.state.users, replica.state.quarantine) == ({}, {}, {})
    assert replica.locks == [] and replica.state.events == []
    assert (memory.tenant_ids, set(memory.phone_users.values())) == ({tenant}, {manager.talent_id})


def test_a_user_before_its_tenant_is_deferred_then_applied_from_the_quarantine() -> None:
    replica, tenant = MemoryReplica(), uuid.uuid4()
    options = ApplyOptions(retry_at=lambda attempt: NOW + timedelta(seconds=attempt))

    first = _apply(replica, user_item(tenant), options=options)
    _apply(replica, tenant_item(tenant))
    with replica() as tx:
        again = retry_deferred(tx, Context(uuid.uuid4(), NOW + timedelta(seconds=1)), options, 10)
        tx.commit()

    assert (first.outcomes[0].error, first.outcomes[0].retry_at) == (
        SyncErrorCode.COMPANY_NOT_FOUND,
        NOW + timedelta(seconds=1),
    )
    assert [o.result for o in again.outcomes] == [ItemResult.APPLIED]
    assert replica.state.quarantine == {} and len(replica.state.users) == 1


def test_blocking_a_company_revokes_its_managers_default_role_and_restoring_grants_it_back() -> None:
    replica, tenant = MemoryReplica(), uuid.uuid4()
    _apply(replica, tenant_item(tenant), user_item(tenant))
    [manager] = replica.state.users.values()

    blocked = _apply(replica, tenant_item(tenant, version=2, isDeleted=True))
    revoked = replica.state.roles[manager.user_id].copy()
    restored = _apply(replica, tenant_item(tenant, version=3))

    assert [o.change for o in (*blocked.outcomes, *restored.outcomes)] == [Change.BLOCKED, Change.RESTORED]
    assert (revoked, replica.state.roles[manager.user_id]) == (set(), {DEFAULT_ROLE.role_id})
    assert replica.state.event_types()[-4:] == [
        "CompanyUpserted",
        "UserAccessChanged",
        "CompanyUpserted",
        "UserAccessChanged",
    ]


def test_deleting_an_absent_user_keeps_an_older_snapshot_from_creating_it() -> None:
    replica, tenant, user = MemoryReplica(), uuid.uuid4(), uuid.uuid4()
    _apply(replica, tenant_item(tenant))

    deleted = _apply(replica, user_item(tenant, user, version=4, isDeleted=True))
    older = _apply(replica, user_item(tenant, user, version=3))

    assert [(o.result, o.stale) for o in (*deleted.outcomes, *older.outcomes)] == [
        (ItemResult.SKIPPED, False),
        (ItemResult.SKIPPED, True),
    ]
    assert replica.state.users == {}


def test_replaying_the_quarantine_applies_what_now_can_and_refuses_unknown_ids() -> None:
    replica, tenant, run_id = MemoryReplica(), uuid.uuid4(), uuid.uuid4()
    _apply(replica, user_item(tenant), options=ApplyOptions(run_id=run_id))
    [entry_id] = replica.state.quarantine
    _apply(replica, tenant_item(tenant))
    unknown: UUID = uuid.uuid4()

    with pytest.raises(NotFoundError, match=str(unknown)):
        replay_quarantined(replica, Context(uuid.uuid4(), NOW), run_id=run_id, item_ids=[entry_id, unknown])
    replayed = replay_quarantined(replica, Context(uuid.uuid4(), NOW), run_id=run_id, item_ids=[entry_id])

    assert [o.result for o in replayed.batch.outcomes] == [ItemResult.APPLIED]
    assert replica.state.quarantine == {} and len(replica.state.users) == 1


def test_a_deletion_behind_a_user_deferred_for_its_tenant_waits_so_the_user_is_created_then_blocked() -> None:
    replica, tenant, user = MemoryReplica(), uuid.uuid4(), uuid.uuid4()
    options = ApplyOptions(retry_at=lambda attempt: NOW + timedelta(seconds=attempt))

    early = _apply(replica, user_item(tenant, user, version=3), options=options)
    deleted = _apply(replica, user_item(tenant, user, version=4, isDeleted=True), options=options)
    _apply(replica, tenant_item(tenant))
    with replica() as tx:
        again = retry_deferred(tx, Context(uuid.uuid4(), NOW + timedelta(seconds=1)), options, 10)
        tx.commit()

    assert _results(early) + _results(deleted) == [
        (ImportStage.USERS, ItemResult.FAILED, SyncErrorCode.COMPANY_NOT_FOUND),
        (ImportStage.USERS, ItemResult.FAILED, SyncErrorCode.COMPANY_NOT_FOUND),
    ]
    assert _results(again) == [
        (ImportStage.USERS, ItemResult.APPLIED, Change.CREATED),
        (ImportStage.USERS, ItemResult.APPLIED, Change.BLOCKED),
    ]
    assert replica.state.quarantine == {} and replica.state.users[user].status == "Blocked"  # type: ignore[index]
