"""The replica's rules as pure decisions: parsing, the version guard, quarantine codes, lifecycle."""

from __future__ import annotations

import uuid
from dataclasses import replace
from typing import Any

import pytest

from pin_identity.adapters.talent_wire import read_item
from pin_identity.domain.events import CompanyState, UserState
from pin_identity.domain.talent import (
    Change,
    CompanyChange,
    ImportStage,
    InvalidSnapshot,
    Quarantine,
    Skip,
    SyncErrorCode,
    TenantSnapshot,
    UserChange,
    UserContext,
    UserSnapshot,
    decide_tenant,
    decide_user,
)
from tests.support import talent

TENANT_ID = uuid.uuid4()
USER_ID = uuid.uuid4()
COMPANY_ID = uuid.uuid4()

Record = tuple[str | None, Any]  # a record as it comes: its key, and its decoded value (None: a tombstone)


def parse_tenant(record: Record) -> TenantSnapshot:
    snapshot = read_item(ImportStage.TENANTS, *record).snapshot
    assert isinstance(snapshot, TenantSnapshot), snapshot
    return snapshot


def parse_user(record: Record) -> UserSnapshot:
    snapshot = read_item(ImportStage.USERS, *record).snapshot
    assert isinstance(snapshot, UserSnapshot), snapshot
    return snapshot


def _tenant(**fields: Any) -> Record:
    return (str(TENANT_ID), talent.tenant(TENANT_ID, **{"version": 2, "taxId": None, **fields}))


def _user(**fields: Any) -> Record:
    known = {"version": 2, "phone": "8 912 345 67 89", "email": None, **fields}
    return (str(USER_ID), talent.user(str(TENANT_ID), USER_ID, **known))


def _company(**fields: Any) -> CompanyState:
    company = CompanyState(COMPANY_ID, "Old", "Developer", "Active", None, "TalentIdentity", TENANT_ID, 2)
    return replace(company, **fields)


def _replica_user(**fields: Any) -> UserState:
    user = UserState(
        uuid.uuid4(), COMPANY_ID, "DeveloperManager", "Active", "+79123456789", None, "Иван", "Петров", None,
        "TalentSync", "TalentIdentity", USER_ID, 2,
    )  # fmt: skip
    return replace(user, **fields)


# ---------------------------------------------------------------- parsing


@pytest.mark.parametrize(
    "record",
    [
        (str(TENANT_ID), ["not", "an", "object"]),
        (str(uuid.uuid4()), _tenant()[1]),  # key and tenantId disagree
        _tenant(version=0),
        _tenant(version="3"),
        _tenant(version=True),
        _tenant(name="  "),
        _tenant(tenantId="tenant-1"),
        _tenant(isDeleted="no"),
        ("not-a-uuid", None),
    ],
)
def test_malformed_tenant_records_are_invalid(record: Record) -> None:
    assert isinstance(read_item(ImportStage.TENANTS, *record).snapshot, InvalidSnapshot)


@pytest.mark.parametrize("phone", ["not-a-phone", "12", "", None])
def test_a_user_without_a_valid_phone_is_invalid(phone: object) -> None:
    assert isinstance(read_item(ImportStage.USERS, *_user(phone=phone)).snapshot, InvalidSnapshot)


@pytest.mark.parametrize("written", ["+7 (912) 345-67-89", "8 912 345 67 89", "9123456789", "+79123456789"])
def test_phones_in_any_common_form_become_e164(written: str) -> None:
    assert parse_user(_user(phone=written)).phone == "+79123456789"


def test_a_tombstone_is_a_deletion_without_a_version() -> None:
    snapshot = parse_user((str(USER_ID), None))
    assert (snapshot.user_id, snapshot.version, snapshot.is_deleted) == (USER_ID, None, True)


def test_a_deleted_snapshot_needs_only_its_id_and_version() -> None:
    snapshot = parse_tenant((None, {"tenantId": str(TENANT_ID), "version": 4, "isDeleted": True}))
    assert (snapshot.version, snapshot.is_deleted) == (4, True)


# ---------------------------------------------------------------- tenants


def test_an_absent_tenant_becomes_an_active_talent_company() -> None:
    decision = decide_tenant(parse_tenant(_tenant()), None, lambda: COMPANY_ID)
    assert isinstance(decision, CompanyChange)
    assert decision.change is Change.CREATED
    assert decision.state == CompanyState(
        COMPANY_ID, "Stroy Invest", "Developer", "Active", None, "TalentIdentity", TENANT_ID, 2
    )


@pytest.mark.parametrize("replica_version", [2, 5])
def test_the_version_guard_skips_a_snapshot_not_newer_than_the_replica(replica_version: int) -> None:
    decision = decide_tenant(parse_tenant(_tenant()), _company(replica_version=replica_version), uuid.uuid4)
    assert decision == Skip(stale=True)


def test_a_newer_snapshot_updates_name_and_tax_id() -> None:
    decision = decide_tenant(parse_tenant(_tenant(version=3, taxId="7701")), _company(), uuid.uuid4)
    assert isinstance(decision, CompanyChange)
    assert (decision.change, decision.state.name, decision.state.tax_id) == (
        Change.UPDATED,
        "Stroy Invest",
        "7701",
    )
    assert decision.state.replica_version == 3


def test_an_unknown_company_type_is_quarantined() -> None:
    decision = decide_tenant(parse_tenant(_tenant(companyType="Cooperative")), None, uuid.uuid4)
    assert isinstance(decision, Quarantine)
    assert decision.code is SyncErrorCode.UNKNOWN_COMPANY_TYPE


def test_a_changed_company_type_is_quarantined() -> None:
    decision = decide_tenant(parse_tenant(_tenant(version=3, companyType="Bank")), _company(), uuid.uuid4)
    assert isinstance(decision, Quarantine)
    assert decision.code is SyncErrorCode.COMPANY_TYPE_IMMUTABLE


def test_a_deleted_tenant_blocks_its_company() -> None:
    deleted = parse_tenant((str(TENANT_ID), None))
    decision = decide_tenant(deleted, _company(), uuid.uuid4)
    assert isinstance(decision, CompanyChange)
    assert (decision.change, decision.state.status, decision.state.replica_version) == (
        Change.BLOCKED,
        "Blocked",
        2,
    )


@pytest.mark.parametrize("company", [None, _company(status="Blocked")])
def test_deleting_an_absent_or_blocked_tenant_is_skipped(company: CompanyState | None) -> None:
    deleted = parse_tenant((str(TENANT_ID), None))
    assert decide_tenant(deleted, company, uuid.uuid4) == Skip(stale=False)


def test_a_newer_deletion_of_a_blocked_company_moves_its_version() -> None:
    deleted = parse_tenant(_tenant(version=5, isDeleted=True))
    decision = decide_tenant(deleted, _company(status="Blocked"), uuid.uuid4)
    assert isinstance(decision, CompanyChange)
    assert (decision.change, decision.state.status, decision.state.replica_version) == (
        Change.UPDATED,
        "Blocked",
        5,
    )


def test_a_newer_live_snapshot_restores_a_blocked_company() -> None:
    decision = decide_tenant(parse_tenant(_tenant(version=3)), _company(status="Blocked"), uuid.uuid4)
    assert isinstance(decision, CompanyChange)
    assert (decision.change, decision.state.status) == (Change.RESTORED, "Active")


# ---------------------------------------------------------------- users


def _context(current: UserState | None = None, *, owner: uuid.UUID | None = None) -> UserContext:
    return UserContext(current, COMPANY_ID, owner)


def test_an_absent_user_becomes_an_invited_developer_manager_managed_by_talent() -> None:
    new_id = uuid.uuid4()
    decision = decide_user(parse_user(_user()), _context(), lambda: new_id)
    assert isinstance(decision, UserChange)
    state = decision.state
    assert decision.change is Change.CREATED
    assert (state.user_id, state.company_id, state.type, state.status) == (
        new_id, COMPANY_ID, "DeveloperManager", "Invited"
    )  # fmt: skip
    assert (state.contacts_managed_by, state.sync_source, state.phone) == (
        "TalentSync",
        "TalentIdentity",
        "+79123456789",
    )
    assert (state.external_talent_user_id, state.replica_version) == (USER_ID, 2)


def test_a_user_whose_tenant_is_absent_is_refused() -> None:
    decision = decide_user(parse_user(_user()), UserContext(None, None, None), uuid.uuid4)
    assert isinstance(decision, Quarantine)
    assert decision.code is SyncErrorCode.COMPANY_NOT_FOUND


def test_a_phone_held_by_another_user_is_a_conflict_never_a_merge() -> None:
    decision = decide_user(parse_user(_user()), _context(owner=uuid.uuid4()), uuid.uuid4)
    assert isinstance(decision, Quarantine)
    assert decision.code is SyncErrorCode.PHONE_CONFLICT


def test_a_user_keeping_its_own_phone_is_no_conflict() -> None:
    current = _replica_user(replica_version=1)
    decision = decide_user(parse_user(_user()), _context(current, owner=current.user_id), uuid.uuid4)
    assert isinstance(decision, UserChange)
    assert (decision.change, decision.state.status) == (
        Change.UPDATED,
        "Active",
    )  # an Active user stays Active


def test_the_version_guard_holds_for_users() -> None:
    assert decide_user(parse_user(_user(version=2)), _context(_replica_user()), uuid.uuid4) == Skip(
        stale=True
    )


def test_a_deleted_user_is_blocked_and_an_absent_one_skipped() -> None:
    deleted = parse_user(_user(version=3, isDeleted=True))
    blocked = decide_user(deleted, _context(_replica_user()), uuid.uuid4)
    assert isinstance(blocked, UserChange)
    assert (blocked.change, blocked.state.status, blocked.state.replica_version) == (
        Change.BLOCKED,
        "Blocked",
        3,
    )
    assert decide_user(deleted, _context(), uuid.uuid4) == Skip(stale=False)


def test_a_user_of_another_tenant_moves_and_a_blocked_one_is_restored() -> None:
    moved = decide_user(
        parse_user(_user(version=3)), _context(_replica_user(company_id=uuid.uuid4())), uuid.uuid4
    )
    restored = decide_user(
        parse_user(_user(version=3)), _context(_replica_user(status="Blocked")), uuid.uuid4
    )
    assert isinstance(moved, UserChange)
    assert isinstance(restored, UserChange)
    assert (moved.change, moved.state.company_id) == (Change.MOVED, COMPANY_ID)
    assert (restored.change, restored.state.status) == (Change.RESTORED, "Invited")


def test_a_deletion_seen_while_absent_guards_against_older_snapshots() -> None:
    older = parse_user(_user(version=2))
    newer = parse_user(_user(version=4))
    remembered = UserContext(None, COMPANY_ID, None, deleted_version=3)
    assert decide_user(older, remembered, uuid.uuid4) == Skip(stale=True)
    assert isinstance(decide_user(newer, remembered, uuid.uuid4), UserChange)
    assert decide_tenant(parse_tenant(_tenant(version=3)), None, uuid.uuid4, deleted_version=3) == Skip(
        stale=True
    )


def test_a_deletion_of_an_absent_user_waits_behind_an_older_snapshot_that_awaits_its_tenant() -> None:
    deletion = parse_user(_user(version=4, isDeleted=True))
    tombstone = parse_user((str(USER_ID), None))
    waiting = UserContext(None, None, None, waiting_version=3)

    assert decide_user(deletion, waiting, uuid.uuid4) == Quarantine(
        SyncErrorCode.COMPANY_NOT_FOUND, "an older snapshot of the user awaits its tenant"
    )
    assert decide_user(tombstone, waiting, uuid.uuid4) == Skip(stale=False)
    assert decide_user(deletion, UserContext(None, None, None, waiting_version=4), uuid.uuid4) == Skip(
        stale=False
    )
    blocked = decide_user(deletion, UserContext(_replica_user(), None, None, waiting_version=3), uuid.uuid4)
    assert isinstance(blocked, UserChange) and blocked.change is Change.BLOCKED
