"""`/admin/v1/whoami`: the operator a token belongs to (who the operators are: tokens)."""

from __future__ import annotations

from pin_identity.entrypoints.admin_http.routing import SignedIn, admin_router
from pin_identity.entrypoints.documents import SignedInOperator

operators = admin_router("/admin/v1", "operators")


@operators.get("/whoami", response_model=SignedInOperator)
def whoami(operator: SignedIn) -> SignedInOperator:
    """The operator this token belongs to and their role: the console shows it, and offers a viewer no
    actions (the server still refuses them: 403 `IDENTITY_ADMIN_FORBIDDEN`)."""
    return SignedInOperator(name=operator.name, role=operator.role)
