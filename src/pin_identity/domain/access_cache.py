"""Reference consumer of UserAccessChanged: how a downstream service keeps a per-user access cache.

Rules (access-fanout spec, "Version-ось"): versions are compared only within one axis of one role of
one user, because fan-out versions (RoleDefinition.Version) and point versions (max RoleAssignment.Version)
are different scales. A lower version on the same (userId, changedRoleId, axis) is dropped; otherwise
the event's full snapshot replaces the user's cached access. A version that cannot be read, or the same
version carrying a different snapshot, invalidates the user's cache entirely (the safe fallback).

Nothing in this service calls it: it is documentation for downstream teams, in code so that the tests
(tests/unit/test_access_cache.py, tests/integration/test_access_fanout.py) hold it to the events we publish.
Keep it when it looks unused.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from pin_identity.domain.model import AccessChangeReason


class AccessAxis(StrEnum):
    ROLE = "role"  # RolePermissionsChanged, RoleArchived: RoleDefinition.Version
    ASSIGNMENT = "assignment"  # RoleAssigned, RoleRevoked, RoleExpired: max(RoleAssignment.Version)


def axis_of(reason: AccessChangeReason) -> AccessAxis:
    if reason in (AccessChangeReason.ROLE_PERMISSIONS_CHANGED, AccessChangeReason.ROLE_ARCHIVED):
        return AccessAxis.ROLE
    return AccessAxis.ASSIGNMENT


class CacheDecision(StrEnum):
    APPLIED = "applied"
    DROPPED_STALE = "dropped-stale"
    INVALIDATED = "invalidated"


@dataclass
class UserAccessCache:
    """user id -> the cached active assignments; versions seen per (user, changed role, axis)."""

    assignments: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    _versions: dict[tuple[str, str, AccessAxis], tuple[int, list[dict[str, Any]]]] = field(
        default_factory=dict
    )

    def apply(self, payload: dict[str, Any]) -> CacheDecision:
        user_id = str(payload["userId"])
        try:
            version = payload["version"]
            if not isinstance(version, int) or isinstance(version, bool) or version < 1:
                raise ValueError(version)
            key = (
                user_id,
                str(payload["changedRoleId"]),
                axis_of(AccessChangeReason(payload["changeReason"])),
            )
        except (KeyError, ValueError):
            return self._invalidate(user_id)
        snapshot = list(payload.get("activeAssignments") or [])
        seen = self._versions.get(key)
        if seen is not None and version < seen[0]:
            return CacheDecision.DROPPED_STALE
        if seen is not None and version == seen[0] and seen[1] != snapshot:
            return self._invalidate(user_id)  # same version, different content: the versions diverged
        self._versions[key] = (version, snapshot)
        self.assignments[user_id] = snapshot
        return CacheDecision.APPLIED

    def _invalidate(self, user_id: str) -> CacheDecision:
        self.assignments.pop(user_id, None)
        for key in [key for key in self._versions if key[0] == user_id]:
            del self._versions[key]
        return CacheDecision.INVALIDATED
