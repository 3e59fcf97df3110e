"""Access fan-out end to end: enqueue -> every event acknowledged by the broker.

    .venv/bin/python bench/access_fanout.py [--sizes 50000 1000000] [--runs 3] [--pickups 50]
        [--seed simple|realistic] [--floor-seconds S | --floor-output FILE]

Starts its own embedded PostgreSQL (durable defaults) and embedded broker, and runs the product's own
processes: `pin-identity worker --jobs access-fanout` and `pin-identity worker --jobs outbox-relay`
(default settings: BatchSize 500). For each role size it reports the time from the task's enqueue until
the outbox is empty (the relay deletes a row only once the broker acknowledged it), users/s, the page
time at the start and at the end of the role (from the worker's `fanout-batch-processed` log lines),
and the fan-out worker's peak RSS. Pickup latency: enqueue commit -> the task's StartedAt, for small
queued roles enqueued one at a time while the worker idles.

Seeds (bench_database.SeedShape): `simple` (default; the role in one scope, a fifth of its users twice, a
third also hold a second role) or `realistic` (about 2.5 assignment rows per user: a third hold the role in
two scopes, expiring, Revoked and Expired rows mixed in, and former holders in `users`).

The ratio to the floor: this machine's speed drifts from day to day, so targets are ratios to
`../shared/bench/floor.py --quick` (a bare single-threaded loop doing the fan-out's work on the same kind of
servers) run in the same sitting, before this script, not alongside it (they would share the 2 cores):

    .venv/bin/python ../shared/bench/floor.py --quick --skip-verify | tee /tmp/floor.txt
    .venv/bin/python bench/access_fanout.py --floor-output /tmp/floor.txt     # or --floor-seconds 3.21

The script does not run the floor itself: the floor loads a million assignment rows and times five
workloads three times, minutes of work that a rerun of this script with the same floor need not repeat.
Each line then ends with `x_floor`: seconds / (floor * users / 50,000), the ratio to a floor scaled linearly
from its 50,000-user time (target <= 0.8 at 50,000 and at 1,000,000 users).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import statistics
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import psycopg

from bench_brokers import bench_broker, ensure_published_topics
from bench_database import SeedShape, embedded_postgres, fresh_database, scratch_dir, seed_role
from bench_report import machine_line, percentile
from pin_identity.adapters.postgres.database import ConnectionLimits, Database
from pin_identity.adapters.postgres.identity_store import PostgresIdentityTransactions
from pin_identity.adapters.system_clock import SYSTEM_CLOCK
from pin_identity.domain.fanout_policy import FanOutPolicy
from pin_identity.operations import identity_changes
from pin_identity.operations.context import Context

CLI = [sys.executable, "-m", "pin_identity.entrypoints.cli", "worker"]
FLOOR_USERS = 50_000  # the floor's --quick fan-out
_FLOOR_LINE = re.compile(r"^end_to_end_floor\s+50,000\s+([0-9.]+)", re.MULTILINE)


@dataclass
class Workers:
    fanout: subprocess.Popen[bytes]
    relay: subprocess.Popen[bytes]
    log_path: Path

    def stop(self) -> int:
        """Stops both; returns the fan-out worker's peak RSS in kB (VmHWM)."""
        peak = 0
        for line in Path(f"/proc/{self.fanout.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                peak = int(line.split()[1])
        for process in (self.fanout, self.relay):
            process.terminate()
            process.wait(60)
        return peak

    def batch_times_ms(self) -> list[float]:
        stamps = []
        for line in self.log_path.read_text().splitlines():
            if '"fanout-batch-processed"' in line:
                stamps.append(datetime.fromisoformat(json.loads(line)["timestamp"].replace("Z", "+00:00")))
        return [(b - a).total_seconds() * 1000 for a, b in itertools.pairwise(stamps)]


def start_workers(url: str, bootstrap: str, workdir: Path, tag: str) -> Workers:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIN_IDENTITY_")}
    env.update(
        {
            "PIN_IDENTITY_DATABASE_URL": url,
            "PIN_IDENTITY_KAFKA_BOOTSTRAP_SERVERS": bootstrap,
            "PIN_IDENTITY_WORKER_HTTP_PORT": "0",
            "PIN_IDENTITY_LOG_FORMAT": "json",
            "PIN_IDENTITY_KAFKA_TOPIC_PARTITIONS": "12",
            "PIN_IDENTITY_KAFKA_REPLICATION_FACTOR": "1",
        }
    )
    log_path = workdir / f"fanout-{tag}.log"
    with log_path.open("wb") as log, (workdir / f"relay-{tag}.log").open("wb") as relay_log:
        fanout = subprocess.Popen([*CLI, "--jobs", "access-fanout"], env=env, stderr=log)
        relay = subprocess.Popen([*CLI, "--jobs", "outbox-relay"], env=env, stderr=relay_log)
    time.sleep(3)  # both idle and listening before the clock starts
    return Workers(fanout, relay, log_path)


def wait_until_published(url: str, timeout_s: float) -> float:
    deadline = time.monotonic() + timeout_s
    with psycopg.connect(url, autocommit=True) as conn:
        while time.monotonic() < deadline:
            done = conn.execute(
                "SELECT NOT EXISTS (SELECT 1 FROM identity.access_fanout_tasks WHERE status <> 'Completed')"
                " AND NOT EXISTS (SELECT 1 FROM identity.outbox_events)"
            ).fetchone()
            if done and done[0]:
                return time.perf_counter()
            time.sleep(0.02)
    raise TimeoutError("the fan-out did not finish in time")


def change_permissions(database: Database, role_id: uuid.UUID, permissions: list[str]) -> None:
    """The change every access benchmark fans out: the role's permissions replaced through the use case."""
    identity_changes.set_role_permissions(
        PostgresIdentityTransactions(database),
        Context.fresh(SYSTEM_CLOCK),
        role_id=role_id,
        permissions=permissions,
        policy=FanOutPolicy(200),
    )


def publish_role_change(url: str, role_id: uuid.UUID, timeout_s: float) -> tuple[float, float]:
    """Changes the role's permissions and waits until every holder's event is published (the workers
    running); returns the `time.perf_counter()` of the change and of the last publication."""
    database = Database(url, limits=ConnectionLimits()).open()
    try:
        started = time.perf_counter()
        change_permissions(database, role_id, ["deals.read", "deals.approve"])
        return started, wait_until_published(url, timeout_s)
    finally:
        database.close()


def run_fanout(
    admin_url: str, bootstrap: str, workdir: Path, users: int, run: int, shape: SeedShape
) -> dict[str, float]:
    url = fresh_database(admin_url, f"bench_fanout_{users}_{run}")
    role_id = seed_role(url, users, shape)
    workers = start_workers(url, bootstrap, workdir, f"{users}-{run}")
    try:
        started, finished = publish_role_change(url, role_id, timeout_s=600)
        with psycopg.connect(url) as conn:
            row = conn.execute(
                "SELECT EXTRACT(EPOCH FROM completed_at - created_at) FROM identity.access_fanout_tasks"
            ).fetchone()
        task_seconds = float(row[0]) if row else float("nan")
    finally:
        peak_kb = workers.stop()
    pages = workers.batch_times_ms()
    elapsed = finished - started
    return {
        "seconds": elapsed,
        "task_done_s": task_seconds,  # the last batch committed; the rest is the relay catching up
        "users_per_s": users / elapsed,
        "first_pages_ms": _median(pages[:20]),
        "last_pages_ms": _median(pages[-20:]),
        "peak_rss_mb": peak_kb / 1024,
    }


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def pickup_latencies(admin_url: str, bootstrap: str, workdir: Path, count: int) -> list[float]:
    url = fresh_database(admin_url, "bench_pickup")
    roles = [seed_role(url, 201) for _ in range(count)]
    workers = start_workers(url, bootstrap, workdir, "pickup")
    database = Database(url, limits=ConnectionLimits()).open()
    try:
        for role_id in roles:
            change_permissions(database, role_id, ["x"])
            time.sleep(0.2)
        wait_until_published(url, timeout_s=120)
        with psycopg.connect(url) as conn:
            rows = conn.execute(
                "SELECT EXTRACT(EPOCH FROM started_at - created_at) * 1000 FROM identity.access_fanout_tasks"
            ).fetchall()
    finally:
        database.close()
        workers.stop()
    return sorted(float(row[0]) for row in rows)


def floor_seconds(args: argparse.Namespace) -> float | None:
    """The floor's end_to_end_floor median for 50,000 users, given or read from its saved output."""
    if args.floor_output is None:
        given: float | None = args.floor_seconds
        return given
    found = _FLOOR_LINE.search(Path(args.floor_output).read_text(encoding="utf-8"))
    if found is None:
        raise SystemExit(f"{args.floor_output}: no 'end_to_end_floor  50,000' row in the floor's output")
    return float(found.group(1))


def floor_ratio(seconds: float, users: int, floor: float | None) -> str:
    """Against a linear floor: the floor's 50,000-user time scaled to this role's size (target <= 0.8)."""
    if floor is None:
        return ""
    return f", x_floor {seconds / (floor * users / FLOOR_USERS):.2f}"


def report(label: str, figures: dict[str, float], users: int, floor: float | None) -> None:
    line = ", ".join(f"{k} {v:,.1f}" for k, v in figures.items())
    print(f"{users:>9,} users {label}: {line}{floor_ratio(figures['seconds'], users, floor)}", flush=True)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[50_000, 1_000_000])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--pickups", type=int, default=50)
    parser.add_argument("--seed", type=SeedShape, choices=list(SeedShape), default=SeedShape.SIMPLE)
    floor = parser.add_mutually_exclusive_group()
    floor.add_argument("--floor-seconds", type=float, help="the floor's end_to_end_floor (50,000) median")
    floor.add_argument("--floor-output", help="a file holding the floor's printed results, to read it from")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    floor = floor_seconds(args)
    with (
        scratch_dir("bench-fanout-") as workdir,
        embedded_postgres(workdir) as admin_url,
        bench_broker(workdir) as broker,
    ):
        ensure_published_topics(broker)
        print(f"machine: {machine_line()}; broker: {broker.name}")
        given = f"{floor:.2f} s for 50,000 users" if floor else "not given"
        print(f"seed: {args.seed}; floor: {given}")
        measure(args, admin_url, broker.bootstrap, workdir, floor)


def measure(
    args: argparse.Namespace, admin_url: str, bootstrap: str, workdir: Path, floor: float | None
) -> None:
    for users in args.sizes:
        results = []
        for run in range(args.runs):
            results.append(run_fanout(admin_url, bootstrap, workdir, users, run, args.seed))
            report(f"run {run + 1}", results[-1], users, floor)
        medians = {key: statistics.median(r[key] for r in results) for key in results[0]}
        report("MEDIAN", medians, users, floor)
    if args.pickups:
        latencies = pickup_latencies(admin_url, bootstrap, workdir, args.pickups)
        p99 = percentile(latencies, 0.99)
        p50 = statistics.median(latencies)
        print(f"pickup over {len(latencies)} tasks: p50 {p50:.1f} ms, p99 {p99:.1f} ms")


if __name__ == "__main__":
    main()
