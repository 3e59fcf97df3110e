"""Writing events into the transactional outbox, inside the caller's transaction."""

from __future__ import annotations

from collections.abc import Sequence

import psycopg

from pin_identity.adapters.postgres.catalogue import query
from pin_identity.domain.events import OutboxMessage


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
