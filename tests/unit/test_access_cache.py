"""The reference consumer's rules: per (user, changed role, axis) guard, snapshot wins, safe invalidation."""

from __future__ import annotations

import uuid
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from pin_identity.domain.access_cache import AccessAxis, CacheDecision, UserAccessCache, axis_of
from pin_identity.domain.model import AccessChangeReason

USER, ROLE, OTHER_ROLE = str(uuid.uuid4()), str(uuid.uuid4()), str(uuid.uuid4())


def event(
    version: Any, reason: str = "RolePermissionsChanged", role: str = ROLE, codes: tuple[str, ...] = ("a",)
) -> dict[str, Any]:
    return {
        "userId": USER,
        "changedRoleId": role,
        "changeReason": reason,
        "version": version,
        "activeAssignments": [{"roleCode": code} for code in codes],
    }


def test_axes_separate_role_versions_from_assignment_versions() -> None:
    assert axis_of(AccessChangeReason.ROLE_PERMISSIONS_CHANGED) is AccessAxis.ROLE
    assert axis_of(AccessChangeReason.ROLE_ARCHIVED) is AccessAxis.ROLE
    assert {
        axis_of(r)
        for r in (
            AccessChangeReason.ROLE_ASSIGNED,
            AccessChangeReason.ROLE_REVOKED,
            AccessChangeReason.ROLE_EXPIRED,
        )
    } == {AccessAxis.ASSIGNMENT}


def test_a_lower_version_on_the_same_axis_is_dropped() -> None:
    cache = UserAccessCache()
    assert cache.apply(event(5, codes=("new",))) is CacheDecision.APPLIED
    assert cache.apply(event(4, codes=("old",))) is CacheDecision.DROPPED_STALE
    assert cache.assignments[USER] == [{"roleCode": "new"}]


def test_versions_of_other_axes_and_roles_are_not_compared() -> None:
    cache = UserAccessCache()
    cache.apply(event(50))
    assert cache.apply(event(2, reason="RoleAssigned", codes=("b",))) is CacheDecision.APPLIED
    assert cache.apply(event(1, role=OTHER_ROLE, codes=("c",))) is CacheDecision.APPLIED
    assert cache.assignments[USER] == [{"roleCode": "c"}]  # the newest snapshot wins


def test_a_duplicate_delivery_is_applied_again_harmlessly() -> None:
    cache = UserAccessCache()
    cache.apply(event(3))
    assert cache.apply(event(3)) is CacheDecision.APPLIED


def test_same_version_with_a_different_snapshot_invalidates_the_user() -> None:
    cache = UserAccessCache()
    cache.apply(event(3, codes=("a",)))
    assert cache.apply(event(3, codes=("b",))) is CacheDecision.INVALIDATED
    assert USER not in cache.assignments
    assert cache.apply(event(1)) is CacheDecision.APPLIED  # after invalidation nothing old is remembered


@given(st.one_of(st.none(), st.text(), st.floats(), st.just(0), st.just(-1), st.booleans()))
def test_an_unreadable_version_invalidates_the_user(version: Any) -> None:
    cache = UserAccessCache()
    cache.apply(event(2))
    assert cache.apply(event(version)) is CacheDecision.INVALIDATED
    assert USER not in cache.assignments


def test_an_unknown_change_reason_invalidates_the_user() -> None:
    cache = UserAccessCache()
    cache.apply(event(2))
    assert cache.apply(event(3, reason="SomethingNew")) is CacheDecision.INVALIDATED
