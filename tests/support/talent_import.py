"""Running the initial import in-process against the test servers and a simulated Talent."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from pin_identity.composition import Container
from pin_identity.config import Settings
from pin_identity.domain.events import now_utc
from pin_identity.domain.talent_import import ImportRequest, ImportRun
from pin_identity.jobs.talent_import import ImportSettings, TalentImportJob, start_run

FAST = ImportSettings(page_lease_s=600, max_page_attempts=3, idle_wait_s=0.02, backoff_base_s=0.01, backoff_max_s=0.05)


@contextmanager
def import_container(settings: Settings, **overrides: Any) -> Iterator[Container]:
    """A container whose settings point at this test's Talent (API URL, topics)."""
    container = Container(settings.model_copy(update=overrides))
    try:
        yield container
    finally:
        container.close()


def job(container: Container, settings: ImportSettings = FAST) -> TalentImportJob:
    return TalentImportJob(
        container.import_store, container.run_lock(), container.talent_source, settings, now_utc
    )


def run_to_end(container: Container, request: ImportRequest, settings: ImportSettings = FAST) -> ImportRun:
    """What `talent-import run` does: start or resume under the lock, then drive the run to its end."""
    runner = job(container, settings)
    source = container.talent_source(request.mode)
    try:
        run = start_run(container.import_store, runner.lock, source, request, now_utc())
    finally:
        source.close()
    return runner.drive(run, threading.Event())
