"""What the standard OTEL_* variables ask of tracing: the SDK's OTLP exporters (HTTP/protobuf by default, or
gRPC), the console's, none; the standard samplers; a value not known here stops the process (exit 2) naming
the variable. And an import run's trace: every process derives the same ids from the run's CorrelationId."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from pin_identity.observability import tracing
from pin_identity.observability.tracing import ImportTrace, TracingConfigurationError, tracer_provider


def _exporters(provider: TracerProvider) -> list[SpanExporter]:
    processors = provider._active_span_processor._span_processors
    return [processor.span_exporter for processor in processors]  # type: ignore[attr-defined]


def test_otlp_is_http_protobuf_by_default_and_grpc_when_asked() -> None:
    http = tracer_provider({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4318"})
    assert http is not None
    assert [type(e) for e in _exporters(http)] == [HttpExporter]
    grpc = tracer_provider({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc"})
    assert grpc is not None
    assert [type(e) for e in _exporters(grpc)] == [GrpcExporter]
    both = tracer_provider({"OTEL_TRACES_EXPORTER": "otlp,console", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"})
    assert both is not None
    assert [type(e) for e in _exporters(both)] == [GrpcExporter, ConsoleSpanExporter]
    for provider in (http, grpc, both):
        provider.shutdown()


@pytest.mark.parametrize(
    "environ",
    [{}, {"OTEL_TRACES_EXPORTER": "none"}, {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"}],
)
def test_tracing_is_off_unless_an_exporter_is_named(environ: dict[str, str]) -> None:
    assert tracer_provider(environ) is None


def test_the_samplers_are_the_standard_ones() -> None:
    def sampler(**environ: str) -> str:
        provider = tracer_provider({"OTEL_TRACES_EXPORTER": "console", **environ})
        assert provider is not None
        return str(provider.sampler.get_description())

    assert sampler().startswith("ParentBased{root:AlwaysOnSampler,")
    assert sampler(OTEL_TRACES_SAMPLER="always_off") == "AlwaysOffSampler"
    assert sampler(OTEL_TRACES_SAMPLER="traceidratio", OTEL_TRACES_SAMPLER_ARG="0.25") == (
        "TraceIdRatioBased{0.25}"
    )
    assert sampler(OTEL_TRACES_SAMPLER="parentbased_traceidratio", OTEL_TRACES_SAMPLER_ARG="0.5").startswith(
        "ParentBased{root:TraceIdRatioBased{0.5}"
    )


@pytest.mark.parametrize(
    ("environ", "named"),
    [
        ({"OTEL_TRACES_EXPORTER": "jaeger"}, "OTEL_TRACES_EXPORTER=jaeger"),
        (
            {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"},
            "OTEL_EXPORTER_OTLP_PROTOCOL=http/json",
        ),
        ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_TRACES_SAMPLER": "sometimes"}, "OTEL_TRACES_SAMPLER=some"),
        (
            {
                "OTEL_TRACES_EXPORTER": "otlp",
                "OTEL_TRACES_SAMPLER": "traceidratio",
                "OTEL_TRACES_SAMPLER_ARG": "2",
            },
            "OTEL_TRACES_SAMPLER_ARG=2",
        ),
    ],
)
def test_a_value_not_known_here_names_its_variable(environ: dict[str, str], named: str) -> None:
    with pytest.raises(TracingConfigurationError, match=named.replace("/", ".")):
        tracer_provider(environ)


def test_an_import_runs_trace_ids_come_from_its_correlation_id() -> None:
    correlation = uuid.uuid4()
    one, other = ImportTrace(correlation), ImportTrace(correlation)
    assert one.trace_id == other.trace_id != ImportTrace(uuid.uuid4()).trace_id
    assert one.stage_span_id("Tenants") == other.stage_span_id("Tenants") != one.stage_span_id("Users")
    assert one.run_span_id() not in {one.stage_span_id("Tenants"), one.stage_span_id("Users")}


def test_the_run_and_stage_spans_take_the_derived_ids_and_pages_name_their_stage(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    exporter = InMemorySpanExporter()
    provider = tracing.new_provider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(tracing, "_import_tracer", provider.get_tracer("test"))
    monkeypatch.setattr(tracing.trace, "get_tracer_provider", lambda: provider)
    run_trace = ImportTrace(uuid.uuid4())
    started = datetime(2026, 12, 1, tzinfo=UTC)

    with tracing.traced(tracing._import_tracer, "page", context=run_trace.stage_context("Users")):
        pass
    run_trace.write_stage_span("Users", started, started + timedelta(seconds=3), {"stage": "Users"})
    run_trace.write_run_span(started, started + timedelta(seconds=5), {})

    page, stage, run = exporter.get_finished_spans()
    assert {s.context.trace_id for s in (page, stage, run)} == {run_trace.trace_id}
    assert (run.context.span_id, run.parent) == (run_trace.run_span_id(), None)
    assert stage.context.span_id == run_trace.stage_span_id("Users")
    assert stage.parent is not None and stage.parent.span_id == run_trace.run_span_id()
    assert page.parent is not None and page.parent.span_id == run_trace.stage_span_id("Users")
    assert (stage.end_time or 0) - (stage.start_time or 0) == 3_000_000_000
    # Spans started afterwards get random ids again.
    with tracing.traced(tracing._import_tracer, "other") as other:
        assert other.get_span_context().trace_id != run_trace.trace_id
