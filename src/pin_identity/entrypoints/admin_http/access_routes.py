"""`/admin/v1/access`: one user's access (`access show`)."""

from __future__ import annotations

from pin_identity.entrypoints.admin_http.problems import problem_responses
from pin_identity.entrypoints.admin_http.routing import ContainerDep, UserId, admin_router
from pin_identity.operations.documents import UserAccessReport

access = admin_router("/admin/v1/access", "access")


@access.get("/users/{userId}", response_model=UserAccessReport, responses=problem_responses(404, 503))
def show_user_access(user_id: UserId, container: ContainerDep) -> UserAccessReport:
    """`access show`: the user's Active assignments beside their last UserAccessChanged on
    pin.identity.access.v1 (read from the end of the partition the user's key goes to), the user's access
    events still in the outbox or dead-lettered, and the verdict (`matching`, `pending`, `drifted`,
    `missing`); 200 whatever the verdict. 503 `IDENTITY_BROKER_UNAVAILABLE` when the broker does not answer
    within 5 s; 503 `IDENTITY_MISCONFIGURED` when PIN_IDENTITY_KAFKA_CONFIG sets a partitioner whose
    placement cannot be computed (`random`)."""
    return container.use_cases.access_show(user_id)
