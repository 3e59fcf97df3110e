"""Drives the real outbox relay until the outbox is drained."""

from __future__ import annotations

import threading

from pin_identity.composition import Container


def publish_outbox(container: Container) -> None:
    container.outbox_relay().run(threading.Event(), once=True)
