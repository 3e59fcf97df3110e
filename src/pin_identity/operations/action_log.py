"""The audit trail of operator actions (CONTRACTS section 6): one `admin-action` line per action, written by
the action itself, whichever entry point asked for it."""

from __future__ import annotations

from dataclasses import dataclass

from pin_identity.observability.logging import AUDIT_EVENT, get_logger

log = get_logger("operator")


@dataclass(frozen=True)
class Actor:
    """Who asked for an action, as its entry point knows them, never a credential: `cli:<os user>`, or
    `http:<operator name>` with the client address the request came from beside it."""

    who: str
    client: str | None = None


def admin_action(action: str, actor: Actor, **what: object) -> None:
    """`what` names the ids the action touched."""
    where = {"client": actor.client} if actor.client is not None else {}
    log.info(AUDIT_EVENT, action=action, who=actor.who, **where, **what)
