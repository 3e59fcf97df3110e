"""OpenTelemetry: spans through the API everywhere; the SDK is set up only when OTEL_* asks for it."""

from __future__ import annotations

import os

from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

_propagator = TraceContextTextMapPropagator()


def configure_tracing(service_name: str = "pin-identity") -> None:
    """OTEL_TRACES_EXPORTER=console prints spans; unset or `none` leaves tracing off (no-op spans)."""
    exporter = os.environ.get("OTEL_TRACES_EXPORTER", "none").strip().lower()
    if exporter in {"", "none"} or os.environ.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

    if exporter != "console":
        raise ValueError(f"OTEL_TRACES_EXPORTER={exporter} is not installed here; use console or none")
    name = os.environ.get("OTEL_SERVICE_NAME", service_name)
    provider = TracerProvider(resource=Resource.create({"service.name": name}))
    provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
    trace.set_tracer_provider(provider)


def tracer(component: str) -> trace.Tracer:
    return trace.get_tracer(f"pin_identity.{component}")


def current_traceparent() -> str | None:
    """The W3C traceparent of the active span, for the events it produces; None when tracing is off."""
    if not trace.get_current_span().get_span_context().is_valid:
        return None
    carrier: dict[str, str] = {}
    _propagator.inject(carrier)
    return carrier.get("traceparent")
