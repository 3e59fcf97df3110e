"""Running the initial import in-process against the test servers and a simulated Talent."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from pin_identity.composition import Container
from pin_identity.config import ImportSettings, Settings
from pin_identity.domain.import_run import (
    ImportMode,
    ImportRequest,
    ImportRun,
)
from pin_identity.jobs.talent_import import TalentImportJob
from pin_identity.operations.import_admin import start_run
from pin_identity.operations.ports.talent_sources import TalentSource
from pin_identity.simulation.simulated_talent import SimulatedTalentApi, TalentDataset, produce_to_topics
from tests.support.talent import TalentTopics

FAST = ImportSettings(
    page_lease_s=600, max_page_attempts=3, idle_wait_s=0.02, backoff_base_s=0.01, backoff_max_s=0.05
)


@contextmanager
def import_container(settings: Settings, **overrides: Any) -> Iterator[Container]:
    """A container whose settings point at this test's Talent (API URL, topics)."""
    container = Container(settings.model_copy(update=overrides))
    try:
        yield container
    finally:
        container.close()


def job(
    container: Container,
    settings: ImportSettings = FAST,
    sources: Callable[[ImportMode], TalentSource] | None = None,
) -> TalentImportJob:
    """The container's import job as a worker has it, with the test's settings (and Talent, if given)."""
    return container.jobs.talent_import(settings=settings, sources=sources)


def start_under(container: Container, runner: TalentImportJob, request: ImportRequest) -> ImportRun:
    """Start (or resume) a run under `runner`'s lock, which it keeps; Talent and the time read as it reads
    them."""
    store = container.stores.import_store
    return start_run(store, runner.lock, runner.sources, request, runner.clock.now())


def run_to_end(container: Container, request: ImportRequest, settings: ImportSettings = FAST) -> ImportRun:
    """What `talent-import run` does: start or resume under the lock, then drive the run to its end."""
    runner = job(container, settings)
    return runner.drive(start_under(container, runner, request), threading.Event())


@dataclass
class TalentWorld:
    """One test's Talent, served either way: the simulated HTTP API or this test's compacted topics."""

    mode: ImportMode
    settings: Settings
    api: SimulatedTalentApi
    topics: TalentTopics
    containers: list[Container] = field(default_factory=list)

    @property
    def container(self) -> Container:
        if not self.containers:
            self.containers.append(
                Container(
                    self.settings.model_copy(
                        update={
                            "talent_api_url": self.api.url,
                            "talent_api_token": "talent-token",
                            "talent_tenants_topic": self.topics.tenants,
                            "talent_users_topic": self.topics.users,
                            "talent_sync_group": self.topics.group,
                        }
                    )
                )
            )
        return self.containers[0]

    def publish(self, dataset: TalentDataset) -> None:
        """Make `dataset` what Talent lists (the API's content; produced to the topics once)."""
        self.api.dataset = dataset
        produce_to_topics(
            self.container.connections.kafka_client_config,
            dataset,
            tenants_topic=self.topics.tenants,
            users_topic=self.topics.users,
        )

    def request(self, **fields: Any) -> ImportRequest:
        return ImportRequest(self.mode, **fields)

    def run(self, settings: ImportSettings = FAST, **fields: Any) -> ImportRun:
        return run_to_end(self.container, self.request(**fields), settings)

    def start(self, runner: TalentImportJob, **fields: Any) -> ImportRun:
        """Start (or resume) a run under `runner`'s lock, which it keeps: the test drives the run."""
        return start_under(self.container, runner, self.request(**fields))

    def close(self) -> None:
        for container in self.containers:
            container.close()
