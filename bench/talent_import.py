"""Talent initial import end to end: ApiPull from the simulated Talent API and TopicReplay from the broker.

    .venv/bin/python bench/talent_import.py [--tenants 5000] [--users 50000] [--page-size 500] [--runs 3]
                                            [--modes api-pull topic-replay] [--partitions 12]
                                            [--kafka-config '{"librdkafka.property": "value"}'] [--json]

Starts its own embedded PostgreSQL (durable defaults) and broker (bench_brokers.py) in a temporary directory.
The dataset is generated once, served over HTTP on loopback by the simulated Talent API (in this process, as
in the tests) and produced once to two compacted topics named for this benchmark (`--partitions` each, batched
as the simulator writes them); that production is setup and timed separately. Each run gets a fresh migrated
database and runs the import as `talent-import run` does, in this process: `start_run` (source check, the
truncated-source guard, the run row) then `TalentImportJob.drive` (listing, pages, the end of the run).

Per run: total wall time from `start_run` until `drive` returns the ended run; items/s = (companies planned +
users planned) / total; page p50/p99 over the job's own `page-applied` events, whose `duration_ms` is one
page's read from the source + apply + commit. The job's source is wrapped only to time its calls, which splits
the total into start, listing, page reads, page apply+commit and the rest (claims, progress queries). A run
must end Completed with every item applied (planned == applied, nothing skipped or failed, the replica holding
every company and user), or the script fails.
`--kafka-config` is passed to the import as PIN_IDENTITY_KAFKA_CONFIG would be (extra librdkafka properties
of the product's clients; default: none).
The page reads alone (p50/p99/max of the source's `read`) and the load average before and after each mode's
runs are printed with the breakdown: the machine is shared.
`--partitions` defaults to the simulated Talent's layout (12).
Targets on a 2-core machine: <= 10 s for each mode (spec: 30 min), page p99 <= 300 ms (spec: 3 s), and the
runs of a mode within 25% of their median ((max - min) / median).
With `--json` the JSON document goes to stdout and the human lines to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, MutableMapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO
from uuid import UUID

import structlog

from bench_brokers import bench_broker
from bench_database import checkpoint, fresh_database, replica_counts
from bench_report import loadavg, machine, percentile
from pin_identity.adapters.postgres.embedded_postgres import ensure_embedded_postgres, stop_embedded_postgres
from pin_identity.adapters.system_clock import SYSTEM_CLOCK
from pin_identity.composition import Container
from pin_identity.config import ConfigurationError, Settings, load_settings
from pin_identity.domain.import_run import ImportMode, ImportRequest, ImportRun, PlanStep, RunStatus
from pin_identity.domain.talent import ImportStage, TalentItem
from pin_identity.operations.documents import ImportResult
from pin_identity.operations.import_admin import start_run
from pin_identity.operations.ports.talent_sources import TalentSource
from pin_identity.simulation.simulated_talent import (
    TALENT_PARTITIONS,
    SimulatedTalentApi,
    TalentDataset,
    create_talent_topics,
    generate_dataset,
    produce_to_topics,
)

TARGET_SECONDS = {"api-pull": 10.0, "topic-replay": 10.0}
TARGET_PAGE_P99_MS = 300.0
TARGET_SPREAD = 0.25
API_TOKEN = "talent-token"  # the simulator's made-up token
MODES = {"api-pull": ImportMode.API_PULL, "topic-replay": ImportMode.TOPIC_REPLAY}


# ---------------------------------------------------------------- measuring inside the job


@dataclass
class Timings:
    """What one run's job reported and how long its source calls took (milliseconds)."""

    pages: list[tuple[str, float]] = field(default_factory=list)  # (stage, page-applied duration_ms)
    page_failures: int = 0
    reads_ms: list[float] = field(default_factory=list)
    plans_ms: list[float] = field(default_factory=list)
    start_ms: float = 0.0  # check + count_companies: the calls start_run makes

    def clear(self) -> None:
        self.pages.clear()
        self.page_failures = 0
        self.reads_ms.clear()
        self.plans_ms.clear()
        self.start_ms = 0.0


class PageEvents:
    """A structlog processor: keeps the job's page events; every line still goes on to the log file."""

    def __init__(self, timings: Timings) -> None:
        self.timings = timings

    def __call__(
        self, _logger: Any, _method: str, event: MutableMapping[str, Any]
    ) -> MutableMapping[str, Any]:
        if event.get("event") == "page-applied":
            self.timings.pages.append((str(event["stage"]), float(event["duration_ms"])))
        elif event.get("event") == "page-failed":
            self.timings.page_failures += 1
        return event


def configure_logging(timings: Timings, log_file: TextIO) -> None:
    """The product's JSON lines, to a file (stdout stays clean for --json), with page events captured."""
    structlog.configure(
        processors=[
            PageEvents(timings),
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.INFO),
        logger_factory=structlog.WriteLoggerFactory(file=log_file),
        cache_logger_on_first_use=False,
    )
    logging.basicConfig(level=logging.WARNING, stream=log_file, format="%(levelname)s %(name)s %(message)s")


@contextlib.contextmanager
def timed(into: list[float]) -> Iterator[None]:
    started = time.perf_counter()
    try:
        yield
    finally:
        into.append((time.perf_counter() - started) * 1000)


class TimedSource:
    """The product's TalentSource, unchanged, with its calls timed."""

    def __init__(self, inner: TalentSource, timings: Timings) -> None:
        self._inner = inner
        self._timings = timings

    def check(self) -> None:
        started = time.perf_counter()
        try:
            self._inner.check()
        finally:
            self._timings.start_ms += (time.perf_counter() - started) * 1000

    def count_companies(self, tenant_filter: UUID | None) -> int | None:
        started = time.perf_counter()
        try:
            return self._inner.count_companies(tenant_filter)
        finally:
            self._timings.start_ms += (time.perf_counter() - started) * 1000

    def plan(
        self, stage: ImportStage, cursor: str | None, page_no: int, page_size: int, tenant_filter: UUID | None
    ) -> PlanStep:
        with timed(self._timings.plans_ms):
            return self._inner.plan(stage, cursor, page_no, page_size, tenant_filter)

    def read(
        self, stage: ImportStage, cursor: str | None, page_size: int, tenant_filter: UUID | None
    ) -> list[TalentItem]:
        with timed(self._timings.reads_ms):
            return self._inner.read(stage, cursor, page_size, tenant_filter)

    def handover(self, cursors: Sequence[str | None]) -> None:
        self._inner.handover(cursors)

    def close(self) -> None:
        self._inner.close()


# ---------------------------------------------------------------- one run


@dataclass(frozen=True)
class Bench:
    """What every run shares: the servers, where Talent is served (API, topics), the dataset."""

    admin_url: str
    bootstrap: str
    api_url: str
    tenants_topic: str
    users_topic: str
    dataset: TalentDataset
    page_size: int
    kafka_config: str
    workdir: Path
    timings: Timings


@dataclass(frozen=True)
class RunResult:
    seconds: float
    items: int
    items_per_s: float
    pages: int
    page_p50_ms: float
    page_p99_ms: float
    page_max_ms: float
    page_retries: int
    read_p50_ms: float  # the source's read alone
    read_p99_ms: float
    read_max_ms: float
    run_duration_ms: int  # the run's own durationMs (started_at -> finished_at, as the result reports it)
    breakdown_s: dict[str, float]  # where the total went


def verify(url: str, run: ImportRun, dataset: TalentDataset, pages: int, timings: Timings) -> None:
    """Fails loudly unless the run did what the figures claim."""
    tenants, users = len(dataset.tenants), len(dataset.users)
    problems = []
    if run.status is not RunStatus.COMPLETED:
        problems.append(f"run ended {run.status.value} ({run.error_code}: {run.error})")
    for name, counters, expected in (("companies", run.companies, tenants), ("users", run.users, users)):
        counted = (counters.planned, counters.applied, counters.skipped, counters.failed)
        if counted != (expected, expected, 0, 0):
            problems.append(f"{name} {asdict(counters)}, expected {expected} planned and applied")
    held = replica_counts(url)
    if (held["companies"], held["users"]) != (tenants, users):
        problems.append(f"the replica holds {held}, expected {tenants} companies and {users} users")
    if len(timings.pages) != pages:
        problems.append(f"{len(timings.pages)} page-applied events for {pages} pages")
    if problems:
        raise SystemExit(f"verification failed ({run.mode.value}, run {run.run_id}): " + "; ".join(problems))


def run_once(bench: Bench, mode: ImportMode, run: int) -> RunResult:
    url = fresh_database(bench.admin_url, f"bench_import_{run}")
    checkpoint(url)  # the migration's writes are flushed before the clock starts
    settings = Settings(
        database_url=url,
        kafka_bootstrap_servers=bench.bootstrap,
        kafka_config=bench.kafka_config,
        talent_api_url=bench.api_url,
        talent_api_token=API_TOKEN,
        talent_tenants_topic=bench.tenants_topic,
        talent_users_topic=bench.users_topic,
        talent_sync_group=f"bench-talent-sync-{uuid.uuid4().hex[:10]}",
        data_dir=bench.workdir,
        worker_http_port=0,
    )
    timings = bench.timings
    timings.clear()
    container = Container(settings)
    try:
        store = container.stores.import_store  # opens the connection pool before the clock starts

        def sources(source_mode: ImportMode) -> TalentSource:
            return TimedSource(container.jobs.talent_source(source_mode), timings)

        job = container.jobs.talent_import(sources=sources)
        started = time.perf_counter()
        begun = start_run(
            store, job.lock, sources, ImportRequest(mode, page_size=bench.page_size), job.clock.now()
        )
        final = job.drive(begun, threading.Event())
        seconds = time.perf_counter() - started
        pages = store.progress(final.run_id).count()
    finally:
        container.close()
    verify(url, final, bench.dataset, pages, timings)
    durations = [ms for _, ms in timings.pages]
    items = final.companies.planned + final.users.planned
    page_s, read_s = sum(durations) / 1000, sum(timings.reads_ms) / 1000
    breakdown = {
        "start": timings.start_ms / 1000,
        "listing": sum(timings.plans_ms) / 1000,
        "page_read": read_s,
        "page_apply_commit": page_s - read_s,
    }
    breakdown["other"] = seconds - sum(breakdown.values())
    return RunResult(
        seconds=seconds,
        items=items,
        items_per_s=items / seconds,
        pages=pages,
        page_p50_ms=percentile(durations, 0.5),
        page_p99_ms=percentile(durations, 0.99),
        page_max_ms=max(durations),
        page_retries=timings.page_failures,
        read_p50_ms=percentile(timings.reads_ms, 0.5),
        read_p99_ms=percentile(timings.reads_ms, 0.99),
        read_max_ms=max(timings.reads_ms),
        run_duration_ms=ImportResult.of(final, SYSTEM_CLOCK.now()).duration_ms,
        breakdown_s=breakdown,
    )


# ---------------------------------------------------------------- setup, report


def serve_topics(bootstrap: str, dataset: TalentDataset, partitions: int, out: TextIO) -> tuple[str, str]:
    """Two compacted topics of the benchmark's own, the dataset produced to them once (timed as setup)."""
    suffix = uuid.uuid4().hex[:10]
    tenants_topic, users_topic = f"bench.talent.tenants.{suffix}", f"bench.talent.users.{suffix}"
    config = {"bootstrap.servers": bootstrap}
    create_talent_topics(config, partitions, tenants_topic=tenants_topic, users_topic=users_topic)
    started = time.perf_counter()
    produce_to_topics(config, dataset, tenants_topic=tenants_topic, users_topic=users_topic, timeout_s=600)
    seconds = time.perf_counter() - started
    records = len(dataset.tenants) + len(dataset.users)
    print(
        f"setup: {records:,} records produced to 2 topics x {partitions} partitions in {seconds:.1f} s "
        f"({records / seconds:,.0f} records/s; not measured)",
        file=out,
        flush=True,
    )
    return tenants_topic, users_topic


def summary(
    args: argparse.Namespace, runs: dict[str, list[RunResult]], loads: dict[str, tuple[str, str]]
) -> dict[str, Any]:
    modes = {}
    for mode, results in runs.items():
        seconds = statistics.median(r.seconds for r in results)
        p99 = statistics.median(r.page_p99_ms for r in results)
        spread = (max(r.seconds for r in results) - min(r.seconds for r in results)) / seconds
        modes[mode] = {
            "median_seconds": seconds,
            "median_items_per_s": statistics.median(r.items_per_s for r in results),
            "median_page_p50_ms": statistics.median(r.page_p50_ms for r in results),
            "median_page_p99_ms": p99,
            "spread": spread,
            "load_before_after": loads[mode],
            "target_met": seconds <= TARGET_SECONDS[mode]
            and p99 <= TARGET_PAGE_P99_MS
            and spread <= TARGET_SPREAD,
            "runs": [asdict(r) for r in results],
        }
    return {
        "benchmark": "talent_import",
        "date": datetime.now(UTC).date().isoformat(),
        "settings": {
            "tenants": args.tenants,
            "users": args.users,
            "page_size": args.page_size,
            "partitions": args.partitions,
            "kafka_config": args.kafka_config,
        },
        "runs": args.runs,
        "targets": {"seconds": TARGET_SECONDS, "page_p99_ms": TARGET_PAGE_P99_MS, "spread": TARGET_SPREAD},
        "target_met": all(m["target_met"] for m in modes.values()),
        "modes": modes,
    }


def print_table(report: dict[str, Any], out: TextIO) -> None:
    s = report["settings"]
    print(
        f"\n{s['tenants']:,} tenants + {s['users']:,} users, page size {s['page_size']}, topics of "
        f"{s['partitions']} partitions, kafka config {s['kafka_config'] or 'default'}, "
        f"runs per mode: {report['runs']}, {report['date']}",
        file=out,
    )
    print(
        "| mode | total (median) | items/s | page p50 / p99 (median) | runs: total | spread"
        " | runs: page p99 |",
        file=out,
    )
    print("|---|---|---|---|---|---|---|", file=out)
    for mode, data in report["modes"].items():
        totals = " / ".join(f"{r['seconds']:.1f} s" for r in data["runs"])
        p99s = " / ".join(f"{r['page_p99_ms']:.0f} ms" for r in data["runs"])
        print(
            f"| {mode} | {data['median_seconds']:.1f} s | {data['median_items_per_s']:,.0f} | "
            f"{data['median_page_p50_ms']:.0f} / {data['median_page_p99_ms']:.0f} ms | {totals} | "
            f"{data['spread']:.0%} | {p99s} |",
            file=out,
        )
    print("\nwhere the time went (median run by total; seconds):", file=out)
    for mode, data in report["modes"].items():
        median_run = sorted(data["runs"], key=lambda r: r["seconds"])[(len(data["runs"]) - 1) // 2]
        parts = ", ".join(f"{k} {v:.1f}" for k, v in median_run["breakdown_s"].items())
        reads = " / ".join(f"{median_run[k]:.0f}" for k in ("read_p50_ms", "read_p99_ms", "read_max_ms"))
        before, after = data["load_before_after"]
        print(
            f"  {mode}: {parts} (pages: {median_run['pages']}, retries: {median_run['page_retries']}; "
            f"page read p50 / p99 / max {reads} ms; load {before} -> {after})",
            file=out,
        )
    targets = ", ".join(f"{mode} <= {seconds:.0f} s" for mode, seconds in TARGET_SECONDS.items())
    verdict = "met" if report["target_met"] else "NOT met"
    print(
        f"targets {targets}, page p99 <= {TARGET_PAGE_P99_MS:.0f} ms, runs within {TARGET_SPREAD:.0%} "
        f"of their median, in every mode run: {verdict}",
        file=out,
    )


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tenants", type=int, default=5_000)
    parser.add_argument("--users", type=int, default=50_000)
    parser.add_argument("--page-size", type=int, default=500)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES))
    parser.add_argument(
        "--partitions", type=int, default=TALENT_PARTITIONS, help="partitions of each Talent topic"
    )
    parser.add_argument(
        "--kafka-config", default="", help="extra librdkafka properties, as PIN_IDENTITY_KAFKA_CONFIG (JSON)"
    )
    parser.add_argument("--json", action="store_true", help="print a JSON document to stdout")
    args = parser.parse_args()
    if args.tenants < 1 or args.users < 0 or args.runs < 1 or args.partitions < 1:
        parser.error("--tenants, --runs and --partitions must be positive, --users not negative")
    try:
        load_settings(kafka_config=args.kafka_config)
    except ConfigurationError as exc:
        parser.error(f"--kafka-config: {exc}")
    if not 1 <= args.page_size <= 2000:
        parser.error("--page-size must be 1..2000")
    return args


def main() -> None:
    args = parse_args()
    out = sys.stderr if args.json else sys.stdout
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the servers are stopped on SIGTERM too
    started = time.perf_counter()
    dataset = generate_dataset(args.tenants, args.users, seed=7)
    workdir = Path(tempfile.mkdtemp(prefix="bench-import-"))
    timings = Timings()
    runs: dict[str, list[RunResult]] = {}
    loads: dict[str, tuple[str, str]] = {}
    with contextlib.ExitStack() as servers:
        log_file = servers.enter_context((workdir / "bench.log").open("w"))
        configure_logging(timings, log_file)
        servers.callback(stop_embedded_postgres, workdir)  # registered first: stopped last
        admin_url = ensure_embedded_postgres(workdir, database="postgres")
        broker = servers.enter_context(bench_broker(workdir))
        api = servers.enter_context(SimulatedTalentApi(dataset, token=API_TOKEN))
        info = machine(admin_url)
        print(
            f"machine: {info['arch']} {info['processor']}, {info['cores']} cores, python {info['python']}, "
            f"postgres {info['postgres']}; broker {broker.name}; logs in {workdir}",
            file=out,
        )
        tenants_topic, users_topic = serve_topics(broker.bootstrap, dataset, args.partitions, out)
        bench = Bench(
            admin_url,
            broker.bootstrap,
            api.url,
            tenants_topic,
            users_topic,
            dataset,
            args.page_size,
            args.kafka_config,
            workdir,
            timings,
        )
        for name in args.modes:
            runs[name] = []
            load_before = loadavg()
            for run in range(args.runs):
                result = run_once(bench, MODES[name], run)
                runs[name].append(result)
                print(
                    f"{name} run {run + 1}: {result.seconds:.1f} s, {result.items_per_s:,.0f} items/s, "
                    f"pages {result.pages}: p50 {result.page_p50_ms:.0f} ms, "
                    f"p99 {result.page_p99_ms:.0f} ms, max {result.page_max_ms:.0f} ms",
                    file=out,
                    flush=True,
                )
            loads[name] = (load_before, loadavg())
    shutil.rmtree(workdir, ignore_errors=True)  # only after a clean run: a failed one keeps its logs
    report = {**summary(args, runs, loads), "machine": info, "wall_seconds": time.perf_counter() - started}
    print_table(report, out)
    print(f"wall time of the benchmark: {report['wall_seconds']:.0f} s", file=out)
    if args.json:
        print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
