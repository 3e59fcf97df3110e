"""`access show`: one user's Active assignments beside their last event on the access topic, and a verdict."""

from __future__ import annotations

from uuid import UUID

from pin_identity.domain.access_verdicts import difference, fingerprint, verdict
from pin_identity.domain.errors import NotFoundError
from pin_identity.operations.ports.access_reads import UserAccessLog, UserAccessStates
from pin_identity.operations.read_models import UserAccessReport


def show_access(log: UserAccessLog, states: UserAccessStates, user_id: UUID) -> UserAccessReport:
    """NotFoundError for a user the database does not hold (the topic is not read for it)."""
    if not states.user_exists(user_id):
        raise NotFoundError(f"user {user_id} does not exist")
    # The topic first, then the database, as the audit does (operations.access_audit): a change committed in
    # between is still in the outbox (pending) unless it was also published in between, which shows as drift
    # that a second look no longer finds.
    search = log.last_event(user_id)
    state = states.user_state(user_id)
    if state is None:  # users are never deleted; a database restored meanwhile is the only way here
        raise NotFoundError(f"user {user_id} does not exist")
    last = search.last_event
    on_topic = last.active_assignments if last is not None else None
    judged = verdict(
        fingerprint(on_topic) if last is not None else None,
        fingerprint(state.active_assignments),
        pending=bool(state.waiting),
    )
    return UserAccessReport.of(state, search, judged, difference(state.active_assignments, on_topic or []))
