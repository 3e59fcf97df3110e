"""How long a legitimate long writer holds publishing: `archive_role` of a large role, a Talent company block.

    .venv/bin/python bench/publishing_held.py [--users 100000] [--managers 5000] [--runs 3] [--json]

Starts its own embedded PostgreSQL (durable defaults) in a temporary directory; no broker and no relay (what
is measured is how long the relay could not read past the writer's first id, not the publishing after it).
Each run uses a fresh migrated database and measures two writers, each one transaction:
- archive: a role held by `--users` users (bench_database.seed_role: a fifth hold it twice, a third also
  hold a second role) archived through `identity.archive_role`: every assignment of it revoked,
  RoleArchived to each holder;
- block: one Talent company with `--managers` managers (applied first through `apply_snapshots`, batches of
  500, untimed), then its deletion applied as one batch: the company Blocked, its managers' default role
  revoked, CompanyUpserted and each manager's RoleRevoked. The block takes a transaction-level advisory lock
  per manager: on a server with the default lock table (max_locks_per_transaction 64, max_connections 100)
  a company of 100,000 managers fails with "out of shared memory", so the default is 5,000.
Meanwhile a session of its own runs the relay's horizon statement (`outbox_id_horizon`) every 10 ms:
publishing is held from the first reading that lists a writer to the first that lists none (the writer took
its first outbox id, and the relay reads nothing past it until the transaction ends). Reported per run: the
held time, the operation's whole time (what it did before taking an id included), and the events it wrote.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any, TextIO

import psycopg
from psycopg.rows import dict_row

from bench_database import checkpoint, embedded_postgres, fresh_database, scratch_dir, seed_role
from bench_report import loadavg, machine
from pin_identity.adapters.postgres.catalogue import query
from pin_identity.adapters.postgres.database import ConnectionLimits, Database
from pin_identity.adapters.postgres.identity_store import PostgresIdentityTransactions
from pin_identity.adapters.postgres.replica_store import PostgresReplicaTransactions
from pin_identity.adapters.system_clock import SYSTEM_CLOCK
from pin_identity.adapters.talent_wire import read_item
from pin_identity.domain.talent import ImportStage
from pin_identity.operations.context import Context
from pin_identity.operations.identity_changes import archive_role
from pin_identity.operations.ports.replica import SourceItem
from pin_identity.operations.talent_replica import ApplyOptions, apply_snapshots
from talent_apply import apply_stage, source_items

WRITERS = ("archive", "block")
LOOK_EVERY_S = 0.01
# Long writers run past the product's 30 s statement timeout only on a machine far slower than this one.
LIMITS = ConnectionLimits(statement_timeout_ms=600_000, idle_in_transaction_timeout_ms=600_000)


@dataclass(frozen=True)
class Held:
    held_s: float  # first reading that listed a writer -> first that listed none
    operation_s: float  # the whole call, from before its transaction began until it committed
    events: int  # outbox rows the transaction wrote


class HorizonWatch:
    """The relay's horizon statement, read every LOOK_EVERY_S in a session of its own while a writer runs."""

    def __init__(self, url: str):
        self._url = url
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self.first_held: float | None = None
        self.last_held: float | None = None
        self.released: float | None = None

    def __enter__(self) -> HorizonWatch:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _watch(self) -> None:
        with psycopg.connect(self._url, autocommit=True, row_factory=dict_row) as conn:
            while not self._stop.is_set():
                horizon = conn.execute(query("outbox_id_horizon")).fetchone()
                now = time.perf_counter()
                if horizon and horizon["writers"]:
                    self.first_held = self.first_held or now
                    self.last_held = now
                elif self.first_held is not None and self.released is None:
                    self.released = now
                self._stop.wait(LOOK_EVERY_S)

    @property
    def held_s(self) -> float:
        if self.first_held is None or self.released is None:
            raise SystemExit("the writer was never seen holding the outbox id sequence, or never let go")
        return self.released - self.first_held


def outbox_rows(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT count(*) FROM identity.outbox_events").fetchone()
    return int(row[0]) if row else 0


def measure(url: str, operation: Callable[[], object]) -> Held:
    before = outbox_rows(url)
    checkpoint(url)
    with HorizonWatch(url) as watch:
        started = time.perf_counter()
        operation()
        operation_s = time.perf_counter() - started
        while watch.released is None and time.perf_counter() - started < operation_s + 5:
            time.sleep(LOOK_EVERY_S)
    return Held(watch.held_s, operation_s, outbox_rows(url) - before)


def measure_archive(database: Database, url: str, users: int) -> Held:
    role_id = seed_role(url, users)
    transactions = PostgresIdentityTransactions(database)
    return measure(url, lambda: archive_role(transactions, Context.fresh(SYSTEM_CLOCK), role_id))


def measure_block(database: Database, url: str, users: int) -> Held:
    """One Talent company with `users` managers, then its deletion (the company Blocked) as one batch."""
    snapshots = source_items(1, users)
    transactions = PostgresReplicaTransactions(database)
    results: Counter[str] = Counter()
    apply_stage(transactions, ImportStage.TENANTS, snapshots.tenants, 500, results)
    apply_stage(transactions, ImportStage.USERS, snapshots.users, 500, results)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")
    key, tenant = snapshots.tenants[0]
    deleted = SourceItem(read_item(ImportStage.TENANTS, key, {**tenant, "isDeleted": True, "version": 99}))

    def block() -> None:
        with transactions() as tx:
            apply_snapshots(tx, [deleted], Context.fresh(SYSTEM_CLOCK), ApplyOptions())
            tx.commit()

    return measure(url, block)


def run_once(admin_url: str, args: argparse.Namespace, run: int, out: TextIO) -> dict[str, Held]:
    held = {}
    for writer, how, size in (
        ("archive", measure_archive, args.users),
        ("block", measure_block, args.managers),
    ):
        url = fresh_database(admin_url, f"bench_held_{writer}_{run}")
        database = Database(url, limits=LIMITS).open()
        try:
            held[writer] = found = how(database, url, size)
        finally:
            database.close()
        print(
            f"run {run + 1}, {writer} (load {loadavg()}): publishing held {found.held_s:.2f} s of "
            f"{found.operation_s:.2f} s, {found.events:,} events",
            file=out,
            flush=True,
        )
    return held


def summary(args: argparse.Namespace, runs: list[dict[str, Held]]) -> dict[str, Any]:
    writers = {
        writer: {
            "median_held_s": statistics.median(run[writer].held_s for run in runs),
            "median_operation_s": statistics.median(run[writer].operation_s for run in runs),
            "runs": [asdict(run[writer]) for run in runs],
        }
        for writer in WRITERS
    }
    return {
        "benchmark": "publishing_held",
        "date": datetime.now(UTC).date().isoformat(),
        "settings": {"users": args.users, "managers": args.managers},
        "runs": args.runs,
        "writers": writers,
    }


def print_table(report: dict[str, Any], out: TextIO) -> None:
    settings = report["settings"]
    print(f"archive: {settings['users']:,} users, block: {settings['managers']:,} managers", file=out)
    print("| writer | publishing held, median | runs (s) | whole operation, median | events |", file=out)
    print("|---|---|---|---|---|", file=out)
    for writer, data in report["writers"].items():
        runs = " / ".join(f"{r['held_s']:.2f}" for r in data["runs"])
        events = data["runs"][0]["events"]
        print(
            f"| {writer} | {data['median_held_s']:.2f} s | {runs} | {data['median_operation_s']:.1f} s "
            f"| {events:,} |",
            file=out,
        )


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=100_000)
    parser.add_argument("--managers", type=int, default=5_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="print a JSON document to stdout")
    args = parser.parse_args()
    if args.users < 1 or args.managers < 1 or args.runs < 1:
        parser.error("--users, --managers and --runs must be positive")
    return args


def main() -> None:
    args = parse_args()
    out = sys.stderr if args.json else sys.stdout
    with scratch_dir("bench-held-") as workdir, embedded_postgres(workdir) as admin_url:
        info = machine(admin_url)
        cores, postgres = info["cores"], info["postgres"]
        print(f"machine: {info['processor']}, {cores} cores, PostgreSQL {postgres}", file=out)
        runs = [run_once(admin_url, args, run, out) for run in range(args.runs)]
        report = {**summary(args, runs), "machine": info}
        print_table(report, out)
        if args.json:
            print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
