"""Writing events into the transactional outbox, inside the caller's transaction."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg

from pin_identity.adapters.postgres.catalogue import query
from pin_identity.domain.events import AccessChangeTemplate, EnvelopeSlot, OutboxMessage

# The positional arguments write_access_changes passes to format(), one per slot.
_FORMAT_ARGUMENT = {
    EnvelopeSlot.EVENT_ID: 1,
    EnvelopeSlot.USER_ID: 2,
    EnvelopeSlot.COMPANY_ID: 3,
    EnvelopeSlot.ACTIVE_ASSIGNMENTS: 4,
}


def write_outbox(conn: psycopg.Connection, messages: Sequence[OutboxMessage]) -> None:
    """COPY, because a fan-out page writes hundreds of rows and COPY is the cheapest way in."""
    if not messages:
        return
    with conn.cursor() as cur, cur.copy(query("copy_outbox_events")) as copy:
        for message in messages:
            copy.write_row(
                (
                    message.event_id,
                    message.topic,
                    message.key,
                    message.event_type,
                    message.correlation_id,
                    message.traceparent,
                    message.value,
                )
            )


def template_params(template: AccessChangeTemplate) -> dict[str, Any]:
    """The parameters of write_access_changes for one template: its envelope as a format() string, which
    the database fills as AccessChangeTemplate.fill would (pin_identity.domain.events owns the event's
    shape and names its three rendering sites)."""
    envelope = [template.pieces[0].replace("%", "%%")]
    for slot, piece in zip(template.slots, template.pieces[1:], strict=True):
        envelope += (f"%{_FORMAT_ARGUMENT[slot]}$s", piece.replace("%", "%%"))
    return {
        "topic": template.topic,
        "event_type": template.event_type,
        "correlation_id": template.correlation_id,
        "traceparent": template.traceparent,
        "envelope": "".join(envelope),
    }
