"""Jaeger, the trace backend a test sends its processes' spans to (OTLP over HTTP/protobuf or gRPC) and reads
back through Jaeger's query API. `make test` builds it from the Go module proxy (the Makefile's `jaeger`
target, from tools/jaeger/go.mod) into the user's cache, as `pin-identity embedded fetch` keeps the Kafka
release there."""

from __future__ import annotations

import json
import os
import socket
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.error import HTTPError
from urllib.parse import urlencode
from urllib.request import urlopen

from tests.support.waiting import wait_until

JAEGER_VERSION = "1.75.0"  # tools/jaeger/go.mod names the same


def jaeger_binary() -> Path:
    """Where `make jaeger` put the binary; a test without it fails saying how to build it."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    binary = cache / "pin-identity" / f"jaeger-{JAEGER_VERSION}" / "jaeger"
    assert binary.is_file(), (
        f"{binary} is missing: `make jaeger` builds it (needs Go; `make test` runs it first)"
    )
    return binary


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


# All in one process, in memory, on loopback ports of the test's own; Jaeger's own telemetry off.
_CONFIG = """
service:
  extensions: [jaeger_storage, jaeger_query]
  pipelines:
    traces:
      receivers: [otlp]
      exporters: [jaeger_storage_exporter]
  telemetry:
    metrics:
      level: none
    logs:
      level: warn
extensions:
  jaeger_storage:
    backends:
      memstore:
        memory:
          max_traces: 10000
  jaeger_query:
    storage:
      traces: memstore
    max_clock_skew_adjust: 0s
    http:
      endpoint: 127.0.0.1:{query_http}
    grpc:
      endpoint: 127.0.0.1:{query_grpc}
receivers:
  otlp:
    protocols:
      grpc:
        endpoint: 127.0.0.1:{otlp_grpc}
      http:
        endpoint: 127.0.0.1:{otlp_http}
exporters:
  jaeger_storage_exporter:
    trace_storage: memstore
"""


@dataclass(frozen=True)
class Span:
    """A span as Jaeger's query API returns it: ids in hex, its parent's span id (None for a root)."""

    trace_id: str
    span_id: str
    name: str
    parent_id: str | None
    attributes: dict[str, Any]
    service: str

    @classmethod
    def of(cls, raw: dict[str, Any], processes: dict[str, Any]) -> Span:
        parents = [ref["spanID"] for ref in raw.get("references", []) if ref["refType"] == "CHILD_OF"]
        return cls(
            trace_id=raw["traceID"].rjust(32, "0"),
            span_id=raw["spanID"].rjust(16, "0"),
            name=raw["operationName"],
            parent_id=parents[0].rjust(16, "0") if parents else None,
            attributes={tag["key"]: tag["value"] for tag in raw.get("tags", [])},
            service=processes[raw["processID"]]["serviceName"],
        )


@dataclass(frozen=True)
class Jaeger:
    otlp_http: str  # OTEL_EXPORTER_OTLP_ENDPOINT for http/protobuf
    otlp_grpc: str  # ... for grpc
    query: str  # the query API's base URL

    def services(self) -> list[str]:
        with urlopen(f"{self.query}/api/services", timeout=5) as answer:
            return list(json.load(answer)["data"] or [])

    def spans(self, service: str, **search: str) -> list[Span]:
        """Every span of the traces Jaeger finds for `service` (and `operation`, `tags`, ... if given)."""
        params = urlencode({"service": service, "limit": "100", "lookback": "1h", **search})
        with urlopen(f"{self.query}/api/traces?{params}", timeout=5) as answer:
            traces = json.load(answer)["data"] or []
        return [Span.of(raw, trace["processes"]) for trace in traces for raw in trace["spans"]]

    def trace(self, trace_id: str) -> list[Span]:
        """Every span of one trace (none while Jaeger has not seen it)."""
        try:
            with urlopen(f"{self.query}/api/traces/{trace_id}", timeout=5) as answer:
                traces = json.load(answer)["data"] or []
        except HTTPError as exc:
            if exc.code == 404:
                return []
            raise
        return [Span.of(raw, trace["processes"]) for trace in traces for raw in trace["spans"]]


@contextmanager
def running_jaeger(workdir: Path) -> Iterator[Jaeger]:
    ports = {name: _free_port() for name in ("query_http", "query_grpc", "otlp_grpc", "otlp_http")}
    config = workdir / "jaeger.yaml"
    config.write_text(_CONFIG.format(**ports), encoding="utf-8")
    log = (workdir / "jaeger.log").open("w")
    process = subprocess.Popen(
        [str(jaeger_binary()), "--config", f"file:{config}"], stdout=log, stderr=subprocess.STDOUT
    )
    jaeger = Jaeger(
        otlp_http=f"http://127.0.0.1:{ports['otlp_http']}",
        otlp_grpc=f"http://127.0.0.1:{ports['otlp_grpc']}",
        query=f"http://127.0.0.1:{ports['query_http']}",
    )
    try:
        wait_until(lambda: _answers(jaeger, process), "Jaeger's query API answers", timeout_s=60)
        yield jaeger
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


def _answers(jaeger: Jaeger, process: subprocess.Popen[bytes]) -> bool:
    assert process.poll() is None, f"Jaeger exited with {process.returncode}"
    try:
        jaeger.services()
    except OSError:
        return False
    return True
