"""The embedded Apache Kafka: time from start to serving clients, and its resident memory.

    .venv/bin/python bench/embedded_broker.py [--runs 5] [--events 200000]

Each run starts a broker on a new log directory (copied from the formatted template in the cache, as every
embedded broker is), waits until it serves clients (`start_broker` returns: the client port accepts
connections, which Kafka opens only once the broker is unfenced), and reads its resident set (VmRSS);
then produces `--events` events of the relay's size (about 600 bytes, lz4, 12 partitions) and reads the
resident set again and its peak (VmHWM); then stops it cleanly and starts it again on the same log directory
(the data kept, as after `embedded stop`), timing that start too. Medians over `--runs`.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from confluent_kafka import Producer

from bench_database import scratch_dir
from bench_report import machine_line
from pin_identity.adapters.kafka.distribution import KAFKA_VERSION, kafka_runtime
from pin_identity.adapters.kafka.embedded_kafka import HEAP_MB, start_broker, stop_broker
from pin_identity.adapters.kafka.topics import TopicLayout, ensure_topics


def memory_kb(pid: int) -> dict[str, int]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            fields[name] = int(value.split()[0])
    return fields


def produce(bootstrap: str, events: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "compression.type": "lz4"})
    value = b"x" * 600
    for n in range(events):
        while True:
            try:
                producer.produce("bench.embedded", value, f"user-{n}".encode())
                break
            except BufferError:
                producer.poll(0.05)
    assert producer.flush(120) == 0


def one_run(workdir: Path, run: int, events: int) -> dict[str, float]:
    home = workdir / f"broker-{run}"
    started = time.perf_counter()
    broker = start_broker(home)
    ready_s = time.perf_counter() - started
    at_ready = memory_kb(broker.pid)
    ensure_topics({"bootstrap.servers": broker.bootstrap_servers}, ["bench.embedded"], TopicLayout(12, 1))
    produce(broker.bootstrap_servers, events)
    loaded = memory_kb(broker.pid)
    stop_broker(broker.pid)
    started = time.perf_counter()
    again = start_broker(home)
    restart_s = time.perf_counter() - started
    stop_broker(again.pid)
    return {
        "ready_s": ready_s,
        "rss_at_ready_mb": at_ready["VmRSS"] / 1024,
        "rss_loaded_mb": loaded["VmRSS"] / 1024,
        "peak_rss_mb": loaded["VmHWM"] / 1024,
        "restart_ready_s": restart_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--events", type=int, default=200_000)
    args = parser.parse_args()
    runtime = kafka_runtime()
    print(f"machine: {machine_line()}")
    print(f"Apache Kafka {KAFKA_VERSION}, heap at most {HEAP_MB} MB, java {runtime.java}")
    with scratch_dir("bench-embedded-") as workdir:
        runs = []
        for run in range(args.runs):
            runs.append(one_run(workdir, run, args.events))
            print(f"run {run + 1}: " + ", ".join(f"{k} {v:.2f}" for k, v in runs[-1].items()), flush=True)
    medians = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
    print("MEDIAN: " + ", ".join(f"{k} {v:.2f}" for k, v in medians.items()))


if __name__ == "__main__":
    main()
