"""The demo's first act: a simulated Talent on loopback, and the real bootstrap of the replica from it."""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from pin_identity.composition import Container
from pin_identity.domain.import_run import ImportMode, ImportRequest, ImportRun, PageStatus
from pin_identity.domain.talent import ImportStage
from pin_identity.operations.import_admin import start_run
from pin_identity.simulation.simulated_talent import SimulatedTalentApi, TalentDataset, generate_dataset

DEMO_TALENT_TOKEN = "demo-talent-token"  # noqa: S105 - the simulated Talent's, on loopback, for this run only
# The poison generate_dataset adds, and the quarantine code each must end with.
EXPECTED_QUARANTINE = Counter(
    {
        "IDENTITY_SYNC_UNKNOWN_COMPANY_TYPE": 1,
        "IDENTITY_SYNC_PHONE_CONFLICT": 1,
        "IDENTITY_SYNC_INVALID_PAYLOAD": 1,
        "IDENTITY_SYNC_COMPANY_NOT_FOUND": 1,
    }
)


@dataclass(frozen=True)
class Bootstrap:
    run: ImportRun
    seconds: float
    quarantine: Counter[str]
    managers_with_one_default_role: int
    dataset: TalentDataset


def bootstrap_from_simulated_talent(
    container: Container, *, companies: int, managers: int, console: Console
) -> Bootstrap:
    """Serve a generated Talent over HTTP and import it with two page workers (the runner and one more)."""
    dataset = generate_dataset(companies, managers, seed=2026, poison=True)
    with SimulatedTalentApi(dataset, token=DEMO_TALENT_TOKEN) as api:
        settings = container.settings.model_copy(
            update={
                "database_url": container.connections.database_url,
                "kafka_bootstrap_servers": container.connections.kafka_bootstrap_servers,
                "talent_api_url": api.url,
                "talent_api_token": DEMO_TALENT_TOKEN,
            }
        )
        talent_side = Container(settings, container.clock)
        try:
            return _import(talent_side, dataset, console)
        finally:
            talent_side.close()


def _import(container: Container, dataset: TalentDataset, console: Console) -> Bootstrap:
    started = container.clock.monotonic()
    request = ImportRequest(ImportMode.API_PULL, page_size=500)
    runner = container.jobs.talent_import()
    run = start_run(
        container.stores.import_store,
        runner.lock,
        container.jobs.talent_source,
        request,
        container.clock.now(),
    )
    stop = threading.Event()
    helper = container.jobs.talent_import()
    helping = threading.Thread(target=helper.run, args=(stop,), name="demo-import-worker", daemon=True)
    helping.start()
    outcome: list[ImportRun] = []
    driving = threading.Thread(
        target=lambda: outcome.append(runner.drive(run, threading.Event())), daemon=True
    )
    driving.start()
    _show_pages(container, run, driving, console)
    stop.set()
    helping.join(30)
    final = outcome[0] if outcome else run
    failed = container.use_cases.imports.failed_items(final.run_id)
    return Bootstrap(
        run=final,
        seconds=container.clock.monotonic() - started,
        quarantine=Counter(item.error_code for item in failed),
        managers_with_one_default_role=container.stores.demo_reads.talent_managers_with_one_default_role(),
        dataset=dataset,
    )


def _show_pages(container: Container, run: ImportRun, driving: threading.Thread, console: Console) -> None:
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, disable=not console.is_terminal) as progress:
        bars = {
            stage: progress.add_task(f"bootstrap: {stage.value} pages", total=None) for stage in ImportStage
        }
        clock = container.clock
        next_line = clock.monotonic()
        while driving.is_alive():
            pages = container.stores.import_store.progress(run.run_id)
            for stage, bar in bars.items():
                progress.update(
                    bar, completed=pages.count(stage, PageStatus.DONE), total=pages.count(stage) or None
                )
            if not console.is_terminal and clock.monotonic() >= next_line:  # plain lines off a terminal
                done, total = pages.count(status=PageStatus.DONE), pages.count()
                console.print(f"bootstrap: {done} of {total} pages planned so far are Done")
                next_line += 3
            driving.join(0.5 if not console.is_terminal else 0.1)
