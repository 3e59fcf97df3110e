"""Talent replica apply throughput: snapshots created, then the same snapshots re-applied as stale.

    .venv/bin/python bench/talent_apply.py [--tenants 5000] [--users 50000] [--batch-size 500] [--runs 3]
                                           [--json]

Starts its own embedded PostgreSQL (durable defaults) in a temporary directory; no broker (the apply logic
writes events to the outbox only). Each run uses a fresh migrated database and applies the simulated dataset
through `apply_snapshots`, one transaction per batch (committed), tenants first, then users:
- create: every snapshot is new (companies, users, default-role grants and their outbox events are written);
- stale: exactly the same snapshots again, every one skipped by the version guard.
Each phase is timed by wall clock and reported in items/s; the counts are checked after every run. The
benchmark's own CPU time (the apply logic's Python, the client side of every statement) is reported beside it:
on a machine others share, it moves less with their load than the wall clock does.
Target (issue 13): >= 6,000 items/s in both phases on a 2-core machine (the first target was 2,000). With
`--json` the JSON document goes to stdout and the human lines to stderr.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any, TextIO

from bench_database import checkpoint, embedded_postgres, fresh_database, replica_counts, scratch_dir
from bench_report import machine
from pin_identity.adapters.postgres.database import ConnectionLimits, Database
from pin_identity.adapters.postgres.replica_store import PostgresReplicaTransactions
from pin_identity.adapters.system_clock import SYSTEM_CLOCK
from pin_identity.adapters.talent_wire import read_item
from pin_identity.domain.talent import ImportStage, ItemResult
from pin_identity.operations.context import Context
from pin_identity.operations.ports.replica import SourceItem
from pin_identity.operations.talent_replica import ApplyOptions, apply_snapshots
from pin_identity.simulation.simulated_talent import generate_dataset

TARGET_ITEMS_PER_S = 6_000
PHASES = ("create", "stale")


@dataclass(frozen=True)
class Snapshots:
    """Records as a source gives them: (key, decoded value); reading them is part of what is timed."""

    tenants: list[tuple[str, dict[str, Any]]]
    users: list[tuple[str, dict[str, Any]]]

    @property
    def total(self) -> int:
        return len(self.tenants) + len(self.users)


@dataclass(frozen=True)
class PhaseResult:
    seconds: float
    cpu_s: float  # this process's CPU time over the phase (not the server's)
    tenants_s: float
    users_s: float
    items_per_s: float
    results: dict[str, int]  # ItemResult -> count; "stale" counts skipped items the version guard held


def source_items(tenants: int, users: int) -> Snapshots:
    dataset = generate_dataset(tenants, users, seed=7)
    return Snapshots(
        [(str(t["tenantId"]), t) for t in dataset.tenants],
        [(str(u["userId"]), u) for u in dataset.users],
    )


def apply_stage(
    transactions: PostgresReplicaTransactions,
    stage: ImportStage,
    records: Sequence[tuple[str, dict[str, Any]]],
    batch_size: int,
    results: Counter[str],
) -> float:
    """Every batch in its own committed transaction; returns the stage's wall-clock seconds."""
    started = time.perf_counter()
    for start in range(0, len(records), batch_size):
        chunk = records[start : start + batch_size]
        items = [SourceItem(read_item(stage, key, value)) for key, value in chunk]
        with transactions() as tx:
            batch = apply_snapshots(tx, items, Context.fresh(SYSTEM_CLOCK), ApplyOptions())
            tx.commit()
        for outcome in batch.outcomes:
            results[outcome.result.value] += 1
            results["stale"] += outcome.stale
    return time.perf_counter() - started


def apply_phase(database: Database, snapshots: Snapshots, batch_size: int) -> PhaseResult:
    transactions = PostgresReplicaTransactions(database)
    results: Counter[str] = Counter({result.value: 0 for result in ItemResult})
    cpu_started = time.process_time()
    tenants_s = apply_stage(transactions, ImportStage.TENANTS, snapshots.tenants, batch_size, results)
    users_s = apply_stage(transactions, ImportStage.USERS, snapshots.users, batch_size, results)
    seconds, cpu_s = tenants_s + users_s, time.process_time() - cpu_started
    return PhaseResult(seconds, cpu_s, tenants_s, users_s, snapshots.total / seconds, dict(results))


def verify(url: str, snapshots: Snapshots, create: PhaseResult, stale: PhaseResult) -> None:
    """Fails loudly unless the run did what the figures claim."""
    tenants, users, total = len(snapshots.tenants), len(snapshots.users), snapshots.total
    expected = {"companies": tenants, "users": users, "outbox_events": tenants + 2 * users}
    problems = []
    if (counts := replica_counts(url)) != expected:
        problems.append(f"replica counts {counts}, expected {expected}")
    if create.results[ItemResult.APPLIED.value] != total:
        problems.append(f"create phase outcomes {create.results}, expected {total} applied")
    if stale.results[ItemResult.SKIPPED.value] != total or stale.results["stale"] != total:
        problems.append(f"stale phase outcomes {stale.results}, expected {total} skipped as stale")
    if problems:
        raise SystemExit("verification failed: " + "; ".join(problems))


def run_once(admin_url: str, snapshots: Snapshots, batch_size: int, run: int) -> dict[str, PhaseResult]:
    url = fresh_database(admin_url, f"bench_talent_{run}")
    database = Database(url, limits=ConnectionLimits()).open()
    try:
        phases = {}
        for phase in PHASES:
            checkpoint(url)
            phases[phase] = apply_phase(database, snapshots, batch_size)
    finally:
        database.close()
    verify(url, snapshots, phases["create"], phases["stale"])
    return phases


def summary(
    args: argparse.Namespace, snapshots: Snapshots, runs: list[dict[str, PhaseResult]]
) -> dict[str, Any]:
    phases = {}
    for phase in PHASES:
        rates = [run[phase].items_per_s for run in runs]
        median = statistics.median(rates)
        phases[phase] = {
            "median_items_per_s": median,
            "median_cpu_s": statistics.median(run[phase].cpu_s for run in runs),
            "target_met": median >= TARGET_ITEMS_PER_S,
            "runs": [asdict(run[phase]) for run in runs],
        }
    return {
        "benchmark": "talent_apply",
        "date": datetime.now(UTC).date().isoformat(),
        "settings": {"tenants": args.tenants, "users": args.users, "batch_size": args.batch_size},
        "runs": args.runs,
        "items_per_phase": snapshots.total,
        "total_items": snapshots.total * len(PHASES) * args.runs,
        "target_items_per_s": TARGET_ITEMS_PER_S,
        "target_met": all(phases[phase]["target_met"] for phase in PHASES),
        "phases": phases,
    }


def print_table(report: dict[str, Any], out: TextIO) -> None:
    settings = report["settings"]
    print(
        f"items per phase: {report['items_per_phase']:,} ({settings['tenants']:,} tenants + "
        f"{settings['users']:,} users), batch size {settings['batch_size']}, runs: {report['runs']}, "
        f"total items applied: {report['total_items']:,}",
        file=out,
    )
    header = "| phase | median items/s | runs (items/s) | runs (s: tenants + users) | median client CPU s |"
    print(header, file=out)
    print("|---|---|---|---|---|", file=out)
    for phase, data in report["phases"].items():
        rates = " / ".join(f"{r['items_per_s']:,.0f}" for r in data["runs"])
        times = " / ".join(f"{r['tenants_s']:.1f} + {r['users_s']:.1f}" for r in data["runs"])
        median, cpu = data["median_items_per_s"], data["median_cpu_s"]
        print(f"| {phase} | {median:,.0f} | {rates} | {times} | {cpu:.2f} |", file=out)
    verdict = "met" if report["target_met"] else "NOT met"
    print(f"target >= {report['target_items_per_s']:,} items/s in both phases: {verdict}", file=out)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tenants", type=int, default=5_000)
    parser.add_argument("--users", type=int, default=50_000)
    parser.add_argument("--batch-size", type=int, default=500)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="print a JSON document to stdout")
    args = parser.parse_args()
    if args.tenants < 1 or args.users < 0 or args.batch_size < 1 or args.runs < 1:
        parser.error("--tenants, --batch-size and --runs must be positive, --users not negative")
    return args


def main() -> None:
    args = parse_args()
    out = sys.stderr if args.json else sys.stdout
    snapshots = source_items(args.tenants, args.users)
    with scratch_dir("bench-talent-") as workdir, embedded_postgres(workdir) as admin_url:
        info = machine(admin_url)
        print(f"machine: {info['arch']}, {info['cores']} cores, python {info['python']}", file=out)
        runs = []
        for run in range(args.runs):
            runs.append(run_once(admin_url, snapshots, args.batch_size, run))
            print(
                f"run {run + 1}: "
                + ", ".join(
                    f"{p} {r.items_per_s:,.0f} items/s ({r.seconds:.1f} s, client CPU {r.cpu_s:.2f} s)"
                    for p, r in runs[-1].items()
                ),
                file=out,
                flush=True,
            )
        report = {**summary(args, snapshots, runs), "machine": info}
        print_table(report, out)
        if args.json:
            print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
