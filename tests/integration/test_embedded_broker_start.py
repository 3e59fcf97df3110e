"""A broker started after `embedded fetch` maps the class archive the fetch prepared (Class Data Sharing),
which is what halves the start of every broker the tests, the demo and the cluster helper launch."""

from __future__ import annotations

from pathlib import Path

from pin_identity.adapters.kafka.distribution import kafka_runtime
from pin_identity.adapters.kafka.embedded import (
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
