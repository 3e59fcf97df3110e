"""Peak memory and CPU of each process the Kubernetes manifests run, measured on the embedded servers.

    .venv/bin/python deploy/kubernetes/measure-resources.py [--pin-identity PATH] [--companies 2000]
                                                          [--managers 50000]

Runs every command of deploy/kubernetes as its own process, as the pods would, against an embedded PostgreSQL
and broker in a temporary directory (started by this script, stopped and removed at the end):

1. `db upgrade` (the db-upgrade Job);
2. `worker --jobs outbox-relay`, `worker --jobs access-fanout`, `worker --jobs talent-import` and `serve`
   (four Deployments), started and left running;
3. `talent-import run --mode api-pull` (the bootstrap Job) against the simulated Talent API on loopback,
   `--companies` companies and `--managers` managers (default: the demo's), the import worker helping;
4. `worker --jobs talent-sync` started afterwards, reading the same dataset from Talent's topics until its
   lag is 0 (every snapshot is then an old version: it parses and skips them all);
5. `roles set-permissions` of `developer-manager`, now held by every manager: a fan-out of all of them,
   until the task is Completed and the relay has emptied the outbox;
6. `serve` answers 50 rounds of the console's reads and `/metrics`;
7. SIGTERM to every long-running process.

Per process it prints the peak resident memory (VmHWM, sampled every 50 ms from /proc), the CPU seconds it
used (user + system, from `wait4`), its wall time and, for the long-running ones, how long it took from
SIGTERM to exit; and how long each phase took. `--pin-identity` runs another installation's console
script, e.g. one installed from the wheel without the `embedded` extra, as the image does, or a wrapper that
runs it on a read-only root filesystem.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import psycopg

from pin_identity.composition import Container
from pin_identity.composition.embedded_servers import stop_embedded_servers
from pin_identity.config import Settings
from pin_identity.simulation.simulated_talent import (
    SimulatedTalentApi,
    create_talent_topics,
    generate_dataset,
    produce_to_topics,
)

ADMIN_TOKEN = "measure-resources-admin-token"  # noqa: S105 - a throwaway token for a loopback server
TALENT_TOKEN = "measure-resources-talent-token"  # noqa: S105
TIMEOUT_S = 600.0


@dataclass
class Usage:
    name: str
    command: str
    peak_rss_mib: float
    cpu_s: float
    wall_s: float
    exit_code: int
    stop_s: float | None = None


class Process:
    """One product process. Its peak memory is its VmHWM, read from /proc while it runs: wait4's ru_maxrss
    would also count the memory of this script, which the child had before its exec. `finish` reaps it with
    wait4 for its CPU time."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], logs: Path):
        self.name, self.command = name, " ".join(argv[1:])
        self.started = time.monotonic()
        self._log = (logs / f"{name}.log").open("wb")
        self.popen = subprocess.Popen(argv, env=env, stdout=self._log, stderr=subprocess.STDOUT)
        self._peak_kib = 0
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._sampler.start()

    def _sample(self) -> None:
        status = Path(f"/proc/{self.popen.pid}/status")
        while True:  # the kernel keeps the high-water mark: the last sample before exit is the peak but 50 ms
            try:
                text = status.read_text()
            except OSError:
                return
            found = re.search(r"^VmHWM:\s+(\d+) kB", text, re.M)
            if found is None:  # a zombie: the memory is gone
                return
            self._peak_kib = max(self._peak_kib, int(found.group(1)))
            time.sleep(0.05)

    def finish(self, stop_s: float | None = None) -> Usage:
        _, status, rusage = os.wait4(self.popen.pid, 0)
        self.popen.returncode = os.waitstatus_to_exitcode(status)
        self._sampler.join()
        self._log.close()
        return Usage(
            self.name,
            self.command,
            self._peak_kib / 1024,
            rusage.ru_utime + rusage.ru_stime,
            time.monotonic() - self.started,
            self.popen.returncode,
            stop_s,
        )

    def terminate(self) -> Usage:
        signalled = time.monotonic()
        self.popen.send_signal(signal.SIGTERM)
        usage = self.finish()
        usage.stop_s = time.monotonic() - signalled
        return usage


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_for(what: str, done: Callable[[], bool], timeout_s: float = TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.5)


def scrape(port: int) -> str:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    except httpx.HTTPError:
        return ""


def sync_caught_up(port: int) -> bool:
    text = scrape(port)
    lags = [float(v) for v in re.findall(r"^talent_sync_consumer_lag\{[^}]*\} (\S+)$", text, re.M)]
    items = [float(v) for v in re.findall(r"^talent_sync_items_total\{[^}]*\} (\S+)$", text, re.M)]
    return bool(lags) and sum(items) > 0 and not any(lags)


def fanout_done(url: str, task_id: str) -> bool:
    with psycopg.connect(url) as conn:
        task = conn.execute(
            "SELECT status FROM identity.access_fanout_tasks WHERE id = %s", (task_id,)
        ).fetchone()
        outbox = conn.execute("SELECT count(*) FROM identity.outbox_events").fetchone()
    return task is not None and task[0] == "Completed" and outbox is not None and outbox[0] == 0


def developer_manager_role(url: str) -> str:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT id FROM identity.role_definitions WHERE code = 'developer-manager' AND company_id IS NULL"
        ).fetchone()
    if row is None:
        raise SystemExit("no developer-manager role after the bootstrap")
    return str(row[0])


def run(cli: str, companies: int, managers: int, work: Path) -> list[Usage]:
    container = Container(Settings(data_dir=work / "data"))
    url, bootstrap = container.connections.database_url, container.connections.kafka_bootstrap_servers
    container.close()
    logs = work / "logs"
    logs.mkdir()
    env = {
        **os.environ,
        "PIN_IDENTITY_DATABASE_URL": url,
        "PIN_IDENTITY_KAFKA_BOOTSTRAP_SERVERS": bootstrap,
        "PIN_IDENTITY_KAFKA_REPLICATION_FACTOR": "1",  # the embedded broker is one node
        "PIN_IDENTITY_LOG_FORMAT": "json",
        "PIN_IDENTITY_ADMIN_TOKEN": ADMIN_TOKEN,
        "PIN_IDENTITY_TALENT_API_TOKEN": TALENT_TOKEN,
    }
    usages = [Process("db-upgrade", [cli, "db", "upgrade"], env, logs).finish()]
    dataset = generate_dataset(companies, managers, seed=2026, poison=True)
    create_talent_topics({"bootstrap.servers": bootstrap})
    produce_to_topics({"bootstrap.servers": bootstrap}, dataset)
    with SimulatedTalentApi(dataset, token=TALENT_TOKEN) as api:
        env["PIN_IDENTITY_TALENT_API_URL"] = api.url
        running: dict[str, Process] = {}
        try:
            usages += scenario(cli, env, url, logs, running)
        finally:
            for process in running.values():
                if process.popen.returncode is None:
                    process.popen.kill()
                    process.finish()
    return usages


def scenario(cli: str, env: dict[str, str], url: str, logs: Path, running: dict[str, Process]) -> list[Usage]:
    ports: dict[str, int] = {}
    for job in ("outbox-relay", "access-fanout", "talent-import"):
        ports[job] = free_port()
        job_env = {**env, "PIN_IDENTITY_WORKER_HTTP_PORT": str(ports[job])}
        running[job] = Process(job, [cli, "worker", "--jobs", job], job_env, logs)
    ports["serve"] = free_port()
    serve_argv = [cli, "serve", "--host", "127.0.0.1", "--port", str(ports["serve"])]
    running["serve"] = Process("serve", serve_argv, env, logs)
    bootstrap_run = [cli, "talent-import", "run", "--mode", "api-pull"]
    with phase("bootstrap"):
        usages = [Process("bootstrap", bootstrap_run, env, logs).finish()]
    ports["talent-sync"] = free_port()
    sync_env = {**env, "PIN_IDENTITY_WORKER_HTTP_PORT": str(ports["talent-sync"])}
    with phase("talent-sync catching up"):
        running["talent-sync"] = Process(
            "talent-sync", [cli, "worker", "--jobs", "talent-sync"], sync_env, logs
        )
        wait_for("talent-sync to catch up", lambda: sync_caught_up(ports["talent-sync"]))
    with phase("fan-out and relay"):
        fan_out(cli, env, url)
    with phase("serve's reads"):
        exercise_serve(ports["serve"])
    return usages + [process.terminate() for process in running.values()]


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
    started = time.monotonic()
    yield
    print(f"phase: {name}, {time.monotonic() - started:.1f} s", file=sys.stderr)


def fan_out(cli: str, env: dict[str, str], url: str) -> None:
    role = developer_manager_role(url)
    change = subprocess.run(
        [cli, "roles", "set-permissions", role, "deals.read", "deals.approve", "measure.resources", "--json"],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    task_id = json.loads(change.stdout)["taskId"]
    wait_for("the fan-out and the relay", lambda: fanout_done(url, task_id))


def exercise_serve(port: int) -> None:
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    base = f"http://127.0.0.1:{port}"
    with httpx.Client(base_url=base, headers=headers, timeout=30) as client:
        for _ in range(50):
            for path in (
                "/admin/v1/health/summary",
                "/admin/v1/talent-import/runs",
                "/admin/v1/roles",
                "/metrics",
            ):
                client.get(path).raise_for_status()


def print_table(usages: list[Usage]) -> None:
    print(
        f"{'process':<14} {'peak RSS':>10} {'CPU':>8} {'wall':>8} {'SIGTERM->exit':>14} {'exit':>5}  command"
    )
    for u in usages:
        stop = f"{u.stop_s:.2f} s" if u.stop_s is not None else "-"
        print(
            f"{u.name:<14} {u.peak_rss_mib:>6.1f} MiB {u.cpu_s:>6.1f} s {u.wall_s:>6.1f} s {stop:>14} "
            f"{u.exit_code:>5}  {u.command}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pin-identity", default=str(Path(sys.executable).with_name("pin-identity")))
    parser.add_argument("--companies", type=int, default=2_000)
    parser.add_argument("--managers", type=int, default=50_000)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="pin-identity-measure-"))
    try:
        usages = run(args.pin_identity, args.companies, args.managers, work)
    finally:
        stop_embedded_servers(work / "data")
    print_table(usages)
    failed = [u.name for u in usages if u.exit_code != 0]
    if failed:
        raise SystemExit(f"non-zero exit: {', '.join(failed)} (logs kept in {work / 'logs'})")
    shutil.rmtree(work)


if __name__ == "__main__":
    main()
