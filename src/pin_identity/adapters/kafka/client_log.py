"""librdkafka's own log lines (a broker down, a refused login, a lost coordinator) written through the
standard `logging` module, and so rendered as every other line (observability/logging.py), instead of raw to
stderr as librdkafka writes them when its client has no `logger`."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

LIBRDKAFKA_LOG = logging.getLogger("librdkafka")


def with_client_log(config: Mapping[str, Any]) -> dict[str, Any]:
    """A Producer's, Consumer's or AdminClient's `config` with the shared logger, unless it names its own
    (a check that reports its outcome as one line of its own silences its client)."""
    return {"logger": LIBRDKAFKA_LOG, **config}


def silenced(name: str) -> logging.Logger:
    """A logger that writes nowhere, for a client whose caller reports its failure as one line of its own."""
    logger = logging.getLogger(f"pin_identity.kafka.{name}")
    logger.addHandler(logging.NullHandler())
    logger.propagate = False
    return logger
