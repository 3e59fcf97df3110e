"""Drives the real outbox relay until the outbox is drained."""

from __future__ import annotations

import threading

import psycopg

from pin_identity.composition import Container


def publish_outbox(container: Container) -> None:
    container.outbox_relay().run(threading.Event(), once=True)


def outbox_count(database_url: str, table: str = "outbox_events") -> int:
    """Rows left in the outbox (or in `outbox_dead_letters`)."""
    with psycopg.connect(database_url) as conn:
        row = conn.execute(f"SELECT count(*) FROM identity.{table}").fetchone()
    return int(row[0]) if row else 0
