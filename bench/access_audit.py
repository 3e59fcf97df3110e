"""The access audit over a whole access topic: time and peak memory of `pin-identity access audit`.

    .venv/bin/python bench/access_audit.py [--users 1000000] [--runs 3] [--seed simple|realistic]

Starts its own embedded PostgreSQL and broker (bench_brokers.py), seeds a role held by `--users` users, and
publishes one UserAccessChanged per user with the product's own processes (a permission change fanned out by
`worker --jobs access-fanout`, published by `worker --jobs outbox-relay`). Then it runs `pin-identity access
audit --json` as a subprocess `--runs` times and reports each run's wall time, the audit's peak RSS (from the
kernel's rusage of that child) and its verdict, and the medians. Target on Kafka: 1,000,000 users in <= 30 s
and <= 250 MB peak RSS.

`--profile FILE` attaches `py-spy record --idle` to each audit once it runs (collapsed stacks, the waits
included, 100 Hz, into FILE.<run>): where the audit's time goes. Its figures are then the profiled process's,
not for the table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from access_fanout import publish_role_change, start_workers
from bench_brokers import bench_broker, ensure_published_topics
from bench_database import SeedShape, checkpoint, embedded_postgres, fresh_database, scratch_dir, seed_role
from bench_report import machine_line


def publish_access_events(url: str, bootstrap: str, workdir: Path, users: int, shape: SeedShape) -> float:
    """Seed the role and fan its permission change out to the topic; returns the seconds it took."""
    role_id = seed_role(url, users, shape)
    workers = start_workers(url, bootstrap, workdir, "audit")
    try:
        started, finished = publish_role_change(url, role_id, timeout_s=900)
        return finished - started
    finally:
        workers.stop()


def run_audit(url: str, bootstrap: str, profile: str | None) -> dict[str, float | str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIN_IDENTITY_")}
    env.update(
        {
            "PIN_IDENTITY_DATABASE_URL": url,
            "PIN_IDENTITY_KAFKA_BOOTSTRAP_SERVERS": bootstrap,
            "PIN_IDENTITY_LOG_FORMAT": "json",
        }
    )
    command = [sys.executable, "-m", "pin_identity.entrypoints.cli", "access", "audit", "--json"]
    started = time.perf_counter()
    child = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    spy = _profile(child.pid, profile) if profile else None
    stdout, stderr = child.communicate()
    if spy is not None:
        spy.wait()
    seconds = time.perf_counter() - started
    if child.returncode not in (0, 1):
        raise RuntimeError(f"audit exited {child.returncode}: {stderr.decode()[-2000:]}")
    report = json.loads(stdout)
    verdict = f"users {report['users']:,} matching {report['matching']:,} drifted {report['drifted']} " + (
        f"missing {report['missing']} pending {report['pending']}"
    )
    return {"seconds": seconds, "verdict": verdict}


def _profile(pid: int, output: str) -> subprocess.Popen[bytes]:
    """py-spy attached to the audit (its own lines kept out of the audit's JSON)."""
    spy = str(Path(sys.executable).with_name("py-spy"))
    command = [spy, "record", "--pid", str(pid), "--idle", "--rate", "100", "--format", "raw"]
    command += ["--output", output]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def timed_audit(url: str, bootstrap: str, profile: str | None) -> dict[str, float | str]:
    """One audit in a fresh child of its own, so that its peak RSS is not any earlier child's."""
    command = [
        sys.executable,
        __file__,
        "--one-audit",
        url,
        bootstrap,
        *(["--profile", profile] if profile else []),
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def one_audit(url: str, bootstrap: str, profile: str | None) -> None:
    import resource

    figures = run_audit(url, bootstrap, profile)
    figures["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(json.dumps(figures))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seed", type=SeedShape, choices=list(SeedShape), default=SeedShape.SIMPLE)
    parser.add_argument(
        "--profile", metavar="FILE", help="py-spy each audit into FILE.<run> (collapsed stacks)"
    )
    parser.add_argument("--one-audit", nargs=2, metavar=("URL", "BOOTSTRAP"), help=argparse.SUPPRESS)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    if args.one_audit:
        one_audit(*args.one_audit, args.profile)
        return
    with (
        scratch_dir("bench-audit-") as workdir,
        embedded_postgres(workdir) as admin_url,
        bench_broker(workdir) as broker,
    ):
        ensure_published_topics(broker)
        print(f"machine: {machine_line()}")
        print(f"broker: {broker.name}; users: {args.users:,}; seed: {args.seed}")
        url = fresh_database(admin_url, f"bench_audit_{args.users}")
        published = publish_access_events(url, broker.bootstrap, workdir, args.users, args.seed)
        print(f"published {args.users:,} events in {published:.1f} s")
        checkpoint(url)
        runs = []
        for run in range(args.runs):
            profile = f"{args.profile}.{run + 1}" if args.profile else None
            runs.append(timed_audit(url, broker.bootstrap, profile))
            figures = runs[-1]
            rss = f"peak RSS {figures['peak_rss_mb']:.0f} MB"
            print(f"run {run + 1}: {figures['seconds']:.1f} s, {rss}, {figures['verdict']}")
        seconds = statistics.median(float(r["seconds"]) for r in runs)
        peak = statistics.median(float(r["peak_rss_mb"]) for r in runs)
        print(f"MEDIAN: {seconds:.1f} s, peak RSS {peak:.0f} MB ({args.users:,} users, {broker.name})")


if __name__ == "__main__":
    main()
