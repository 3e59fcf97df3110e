"""A worker's own /metrics, /healthz and /readyz (PIN_IDENTITY_WORKER_HTTP_PORT)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from pin_identity.config import ConfigurationError
from pin_identity.domain.api_model import ApiModel
from pin_identity.entrypoints.documents import Health
from pin_identity.entrypoints.readiness import ReadinessCheck, readiness_reply
from pin_identity.observability import metrics


def bind_worker_http(
    port: int,
    *,
    alive: Callable[[], bool],
    readiness: ReadinessCheck,
    host: str = "0.0.0.0",  # noqa: S104
) -> ThreadingHTTPServer:
    """Bound and listening but not yet answering (see `start_serving`), so that a port another process holds
    fails the worker at start, as one line naming the variable, before any job has started."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/metrics":
                self._reply(200, generate_latest(metrics.registry), CONTENT_TYPE_LATEST)
            elif self.path == "/healthz":
                alive_now = alive()
                self._document(200 if alive_now else 503, Health(status="ok") if alive_now else None)
            elif self.path == "/readyz":
                self._document(*readiness_reply(readiness, self.path))
            else:
                self._reply(404, b"not found\n", "text/plain")

        def _document(self, code: int, document: ApiModel | None) -> None:
            """The same JSON documents `serve` answers on these paths (a dead job: 503, no body)."""
            if document is None:
                self._reply(code, b"", "text/plain")
                return
            media = "application/problem+json" if code >= 400 else "application/json"
            self._reply(code, document.model_dump_json(exclude_none=True).encode(), media)

        def _reply(self, code: int, body: bytes, content_type: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            return  # probes every few seconds would drown the job logs

    try:
        return ThreadingHTTPServer((host, port), Handler)
    except OSError as exc:
        raise ConfigurationError(
            f"PIN_IDENTITY_WORKER_HTTP_PORT: cannot listen on {host}:{port} ({exc.strerror or exc})"
        ) from None


def start_serving(server: ThreadingHTTPServer) -> None:
    threading.Thread(target=server.serve_forever, name="worker-http", daemon=True).start()
