"""A broker started after `embedded fetch` maps the class archive the fetch prepared (Class Data Sharing),
which is what halves the start of every broker the tests, the demo and the cluster helper launch; and what it
unpacks at run time (lz4-java's native library) stays in its home."""

from __future__ import annotations

from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from pin_identity.adapters.kafka.distribution import kafka_runtime
from pin_identity.adapters.kafka.embedded_kafka import (
    class_archive_path,
    kill_broker,
    prepare_starts,
    start_broker,
)


def test_a_broker_started_after_the_fetch_prepared_its_starts_maps_the_class_archive(tmp_path: Path) -> None:
    runtime = kafka_runtime()
    prepare_starts(runtime)  # `make test` did it already: this finds the archive and returns
    archive = class_archive_path(runtime)

    broker = start_broker(tmp_path / "broker")
    try:
        mapped = Path(f"/proc/{broker.pid}/maps").read_text(encoding="utf-8")
    finally:
        kill_broker(broker.pid)

    assert str(archive) in mapped


def test_a_brokers_unpacked_native_library_stays_in_its_home(tmp_path: Path) -> None:
    home = tmp_path / "broker"
    broker = start_broker(home)
    try:
        client = {"bootstrap.servers": broker.bootstrap_servers}
        # A topic the broker compresses itself: its compressor is lz4-java's native one.
        topic = NewTopic("lz4", 1, 1, config={"compression.type": "lz4"})
        admin = AdminClient(client)
        admin.create_topics([topic])["lz4"].result(30)
        producer = Producer(client)
        producer.produce("lz4", b"value")
        assert producer.flush(30) == 0
        mapped = Path(f"/proc/{broker.pid}/maps").read_text(encoding="utf-8")
    finally:
        kill_broker(broker.pid)

    libraries = {line.split()[-1] for line in mapped.splitlines() if "liblz4-java" in line}
    assert libraries, "the broker never loaded lz4-java's native library"
    assert all(Path(library).parent == home / "tmp" for library in libraries), libraries
