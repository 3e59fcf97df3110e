"""The audit trail of operator actions (CONTRACTS section 6): one `admin-action` line per action, written by
the action itself, whichever entry point asked for it."""

from __future__ import annotations

from pin_identity.observability.logging import AUDIT_EVENT, get_logger

log = get_logger("operator")


def admin_action(action: str, who: str, **what: object) -> None:
    """`who` is the entry point's name for the operator (`cli:<user>`, `http:<client address>`), never a
    credential; `what` names the ids the action touched."""
    log.info(AUDIT_EVENT, action=action, who=who, **what)
