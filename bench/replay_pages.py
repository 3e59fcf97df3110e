"""TopicReplay's page reads: page time against offset and against partition size.

    .venv/bin/python bench/replay_pages.py [--records 54000] [--layouts 3 12] [--page-size 500] [--runs 3]
                                           [--pause-ms 0] [--cpu-hogs 0] [--json]

For each layout (partitions of one compacted topic) a fresh broker is started (bench_brokers.py), `--records`
generated user snapshots are produced to the topic as the simulated Talent produces them (batched), and the
product's own reader (`TopicReplaySource`) plans the topic into pages and reads every page in plan order, as
one import process claims them, `--runs` times, each time with a new reader. Nothing is applied: `--pause-ms`
waits that long after each page instead, standing in for the apply (a reader that keeps its consumer
positioned fetches the next page meanwhile). `--cpu-hogs` runs that many busy-looping processes during the
reads, to show what a loaded machine does to the broker.

Per layout: page read time (p50/p99/max), the median and worst read by where the page starts in its partition
(quarters of the partition), and the Fetch requests the reader's consumer sent per page (librdkafka's own
statistics): a page served in one or two fetch responses costs one or two requests; hundreds mean the broker
answered with empty or one-record responses. The load (`/proc/loadavg`) is printed with each layout.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any, TextIO, cast

from bench_brokers import bench_broker
from bench_database import scratch_dir
from bench_report import loadavg, percentile
from pin_identity.adapters.kafka.replay_source import TopicReplaySource
from pin_identity.domain.errors import SourceUnavailableError
from pin_identity.domain.talent import ImportStage
from pin_identity.simulation.simulated_talent import (
    TalentDataset,
    create_talent_topics,
    generate_dataset,
    produce_to_topics,
)

TENANTS_TOPIC = "bench.replay.tenants"  # created (both topics exist in Talent's layout) but left empty
USERS_TOPIC = "bench.replay.users"
QUARTERS = ("1st", "2nd", "3rd", "4th")


@dataclass(frozen=True)
class PageRead:
    partition: int
    start: int
    records: int  # -1: the read gave up (the reader's own timeout)
    ms: float
    quarter: int  # where the page starts in its partition: 0..3


@dataclass
class FetchCounter:
    """librdkafka's statistics callback: the Fetch requests the reader's consumer has sent so far."""

    fetch_requests: int = 0

    def __call__(self, stats_json: str) -> None:
        stats = json.loads(stats_json)
        brokers = stats.get("brokers", {}).values()
        self.fetch_requests = sum(int(b.get("req", {}).get("Fetch", 0)) for b in brokers)


@dataclass
class LayoutResult:
    partitions: int
    records_per_partition: int
    load_before: str
    load_after: str
    runs: list[dict[str, Any]] = field(default_factory=list)


@contextlib.contextmanager
def cpu_hogs(count: int) -> Iterator[None]:
    hogs = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"], stdin=subprocess.DEVNULL)
        for _ in range(count)
    ]
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


def read_all_pages(bootstrap: str, page_size: int, pause_s: float) -> tuple[list[PageRead], int]:
    """Every page of the users topic, in plan order, with the product's reader; and its Fetch requests (as of
    its last statistics, at most 100 ms before the last page was read)."""
    counter = FetchCounter()
    # The client takes the statistics callback as a configuration entry: a callable, not a string.
    config: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "statistics.interval.ms": "100",
        "stats_cb": counter,
    }
    source = TopicReplaySource(
        cast(dict[str, str], config), tenants_topic=TENANTS_TOPIC, users_topic=USERS_TOPIC
    )
    try:
        pages = source.plan(ImportStage.USERS, None, 0, page_size, None).pages
        ends: dict[int, int] = {}
        for page in pages:
            cursor = json.loads(page.cursor or "{}")
            ends[cursor["partition"]] = max(ends.get(cursor["partition"], 0), cursor["end"])
        reads = []
        for page in pages:
            reads.append(read_one(source, page.cursor, page_size, ends))
            time.sleep(pause_s)
        return reads, counter.fetch_requests
    finally:
        source.close()


def read_one(source: TopicReplaySource, cursor: str | None, page_size: int, ends: dict[int, int]) -> PageRead:
    parsed = json.loads(cursor or "{}")
    partition, start = int(parsed["partition"]), int(parsed["start"])
    started = time.perf_counter()
    try:
        records = len(source.read(ImportStage.USERS, cursor, page_size, None))
    except SourceUnavailableError:
        records = -1
    ms = (time.perf_counter() - started) * 1000
    quarter = min(int(4 * start / max(ends[partition], 1)), 3)
    return PageRead(partition, start, records, ms, quarter)


def summarise(reads: list[PageRead], fetch_requests: int) -> dict[str, Any]:
    times = [r.ms for r in reads]
    by_quarter = {}
    for number, name in enumerate(QUARTERS):
        in_quarter = [r.ms for r in reads if r.quarter == number]
        if in_quarter:
            by_quarter[name] = {"median_ms": statistics.median(in_quarter), "max_ms": max(in_quarter)}
    return {
        "pages": len(reads),
        "gave_up": sum(1 for r in reads if r.records < 0),
        "read_seconds": sum(times) / 1000,
        "p50_ms": percentile(times, 0.5),
        "p99_ms": percentile(times, 0.99),
        "max_ms": max(times),
        "by_quarter": by_quarter,
        "fetch_requests_per_page": fetch_requests / len(reads),
        "reads": [asdict(r) for r in reads],
    }


def measure_layout(
    args: argparse.Namespace, partitions: int, dataset: TalentDataset, out: TextIO
) -> LayoutResult:
    with scratch_dir("bench-replay-") as workdir, bench_broker(workdir) as broker:
        config = {"bootstrap.servers": broker.bootstrap}
        create_talent_topics(config, partitions, tenants_topic=TENANTS_TOPIC, users_topic=USERS_TOPIC)
        produce_to_topics(
            config, dataset, tenants_topic=TENANTS_TOPIC, users_topic=USERS_TOPIC, timeout_s=600
        )
        result = LayoutResult(partitions, math.ceil(len(dataset.users) / partitions), loadavg(), "")
        with cpu_hogs(args.cpu_hogs):
            for run in range(args.runs):
                reads, fetches = read_all_pages(broker.bootstrap, args.page_size, args.pause_ms / 1000)
                summary = summarise(reads, fetches)
                result.runs.append(summary)
                print(f"  {partitions} partitions, run {run + 1}: {line(summary)}", file=out, flush=True)
        result.load_after = loadavg()
        return result


def line(summary: dict[str, Any]) -> str:
    quarters = " / ".join(f"{q['median_ms']:.0f} ({q['max_ms']:.0f})" for q in summary["by_quarter"].values())
    gave_up = f", {summary['gave_up']} gave up" if summary["gave_up"] else ""
    return (
        f"reads {summary['read_seconds']:.1f} s, page p50 {summary['p50_ms']:.0f}"
        f" / p99 {summary['p99_ms']:.0f} / max {summary['max_ms']:.0f} ms;"
        f" by quarter of partition, median (max): {quarters} ms; "
        f"{summary['fetch_requests_per_page']:.1f} fetch requests per page{gave_up}"
    )


def median_run(result: LayoutResult) -> dict[str, Any]:
    return sorted(result.runs, key=lambda r: r["read_seconds"])[(len(result.runs) - 1) // 2]


def print_table(args: argparse.Namespace, results: list[LayoutResult], out: TextIO) -> None:
    print(
        f"\n{args.records:,} records, page size {args.page_size}, pause {args.pause_ms} ms after each page, "
        f"{args.cpu_hogs} CPU hogs, {args.runs} runs per layout (the median run by read time)",
        file=out,
    )
    print(
        "| partitions | records / partition | load before / after | reads (median; runs)"
        " | page p50 / p99 / max | page by quarter of partition: median (max) | fetch requests / page |",
        file=out,
    )
    print("|---|---|---|---|---|---|---|", file=out)
    for result in results:
        mid = median_run(result)
        runs = " / ".join(f"{r['read_seconds']:.1f}" for r in result.runs)
        quarters = " / ".join(f"{q['median_ms']:.0f} ({q['max_ms']:.0f})" for q in mid["by_quarter"].values())
        print(
            f"| {result.partitions} | {result.records_per_partition:,} | {result.load_before} / "
            f"{result.load_after} | {mid['read_seconds']:.1f} s ({runs}) | {mid['p50_ms']:.0f} / "
            f"{mid['p99_ms']:.0f} / {mid['max_ms']:.0f} ms | {quarters} ms | "
            f"{mid['fetch_requests_per_page']:.1f} |",
            file=out,
        )


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=54_000)
    parser.add_argument("--layouts", type=int, nargs="+", default=[3, 12], help="partitions of the topic")
    parser.add_argument("--page-size", type=int, default=500)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--pause-ms", type=float, default=0.0, help="wait after each page (the apply)")
    parser.add_argument("--cpu-hogs", type=int, default=0, help="busy processes during the reads")
    parser.add_argument("--json", action="store_true", help="print a JSON document to stdout")
    args = parser.parse_args()
    if args.records < 1 or args.runs < 1 or min(args.layouts) < 1 or args.cpu_hogs < 0 or args.pause_ms < 0:
        parser.error(
            "--records, --runs and --layouts must be positive, --cpu-hogs and --pause-ms not negative"
        )
    if not 1 <= args.page_size <= 2000:
        parser.error("--page-size must be 1..2000")
    return args


def main() -> None:
    args = parse_args()
    out = sys.stderr if args.json else sys.stdout
    users = generate_dataset(1, args.records, seed=7).users
    dataset = TalentDataset([], users)
    print(f"{args.records:,} user snapshots; load {loadavg()}", file=out, flush=True)
    results = [measure_layout(args, partitions, dataset, out) for partitions in args.layouts]
    print_table(args, results, out)
    if args.json:
        settings = {k: v for k, v in vars(args).items() if k != "json"}
        report = {
            "benchmark": "replay_pages",
            "date": datetime.now(UTC).isoformat(timespec="seconds"),
            "settings": settings,
            "layouts": [asdict(r) for r in results],
        }
        print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
