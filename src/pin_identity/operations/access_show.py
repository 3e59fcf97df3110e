"""`access show`: one user's Active assignments beside their last event on the access topic, and a verdict."""

from __future__ import annotations

from uuid import UUID

from pin_identity.domain.access_verdicts import (
    AssignmentDifferenceView,
    Verdict,
    difference,
    fingerprint,
    verdict,
)
from pin_identity.domain.errors import NotFoundError
from pin_identity.operations.documents import AccessAssignment, UserAccessReport
from pin_identity.operations.ports.access_reads import (
    AccessLogSearch,
    UserAccessLog,
    UserAccessState,
    UserAccessStates,
)


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
    return _report(state, search, judged, difference(state.active_assignments, on_topic or []))


def _report(
    state: UserAccessState, search: AccessLogSearch, judged: Verdict, differs: AssignmentDifferenceView
) -> UserAccessReport:
    """The database's side and the topic's, side by side, with the verdict on them."""
    return UserAccessReport(
        user_id=state.user_id,
        company_id=state.company_id,
        verdict=judged,
        active_assignments=[AccessAssignment.model_validate(a) for a in state.active_assignments],
        last_event=search.last_event,
        partition=search.partition,
        records_read=search.records_read,
        difference=differs,
        outbox=list(state.waiting),
        dead_letters=list(state.dead_letters),
    )
