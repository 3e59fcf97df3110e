"""OpenTelemetry: spans through the API everywhere; the SDK is set up when the standard OTEL_* variables ask.

`OTEL_TRACES_EXPORTER` names the exporters (a comma list): `otlp` (the SDK's own OTLP exporter, over
HTTP/protobuf or gRPC as `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL` / `OTEL_EXPORTER_OTLP_PROTOCOL` say,
HTTP/protobuf by default, to `OTEL_EXPORTER_OTLP[_TRACES]_ENDPOINT`), `console`, or `none` (the default:
no-op spans). The sampler is the standard one `OTEL_TRACES_SAMPLER` / `OTEL_TRACES_SAMPLER_ARG` name; the
resource's attributes come from `OTEL_SERVICE_NAME` and `OTEL_RESOURCE_ATTRIBUTES`. A value none of them
accepts stops the process at start, naming the variable, instead of leaving it without traces.

An import run is one trace however many processes apply its pages: its trace id and the ids of its run and
stage spans are derived from the run's CorrelationId (`ImportTrace`), so a page span started by any process
names its stage span as parent, and the process that ends a stage or the run writes that span with those ids.
"""

from __future__ import annotations

import contextvars
import os
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from datetime import datetime
from hashlib import blake2b
from uuid import UUID

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    Decision,
    ParentBased,
    Sampler,
    TraceIdRatioBased,
)
from opentelemetry.trace import NonRecordingSpan, SpanContext, Status, StatusCode, TraceFlags
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import AttributeValue

from pin_identity.domain.import_run import ImportPage, ImportRun, RunStatus
from pin_identity.domain.talent import ImportStage
from pin_identity.observability.logging import describe_error

_propagator = TraceContextTextMapPropagator()
Span = trace.Span

EXPORTER_VARIABLE = "OTEL_TRACES_EXPORTER"
PROTOCOL_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
SAMPLER_VARIABLE, SAMPLER_ARG_VARIABLE = "OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG"
# The OpenTelemetry specification's default; the Python SDK has no exporter for http/json.
DEFAULT_PROTOCOL = "http/protobuf"


class TracingConfigurationError(ValueError):
    """An OTEL_* variable names what this installation cannot do; the message names the variable."""


def configure_tracing(service_name: str = "pin-identity") -> TracerProvider | None:
    """The process's tracer provider as the OTEL_* variables ask, installed globally; None when tracing is
    off. Raises TracingConfigurationError."""
    provider = tracer_provider(os.environ, service_name)
    if provider is not None:
        trace.set_tracer_provider(provider)
    return provider


def tracer_provider(environ: Mapping[str, str], service_name: str = "pin-identity") -> TracerProvider | None:
    """The tracer provider `environ`'s OTEL_* variables ask for; None when tracing is off (`none`, unset, or
    OTEL_SDK_DISABLED=true). Raises TracingConfigurationError."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    names = [name.strip().lower() for name in environ.get(EXPORTER_VARIABLE, "none").split(",")]
    names = [name for name in names if name and name != "none"]
    if not names:
        return None
    exporters = [_exporter(name, environ) for name in names]
    name = environ.get("OTEL_SERVICE_NAME", service_name)
    provider = new_provider(Resource.create({"service.name": name}), sampler=_sampler(environ))
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


def new_provider(resource: Resource | None = None, sampler: Sampler | None = None) -> TracerProvider:
    """A tracer provider whose ids an import's run and stage spans can choose (`ImportTrace`)."""
    return TracerProvider(
        resource=resource or Resource.create({}),
        sampler=sampler or ParentBased(ALWAYS_ON),
        id_generator=_ChosenIds(),
    )


def _exporter(name: str, environ: Mapping[str, str]) -> SpanExporter:
    if name == "console":
        return ConsoleSpanExporter()
    if name != "otlp":
        raise TracingConfigurationError(f"{EXPORTER_VARIABLE}={name}: not known here (otlp, console or none)")
    protocol = next((environ[v] for v in PROTOCOL_VARIABLES if environ.get(v)), DEFAULT_PROTOCOL)
    protocol = protocol.strip().lower()
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

        return GrpcExporter()
    if protocol == "http/protobuf":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

        return HttpExporter()
    variable = next((v for v in PROTOCOL_VARIABLES if environ.get(v)), PROTOCOL_VARIABLES[-1])
    raise TracingConfigurationError(f"{variable}={protocol}: not known here (http/protobuf or grpc)")


def _sampler(environ: Mapping[str, str]) -> Sampler:
    """The standard sampler OTEL_TRACES_SAMPLER names (the SDK's default, parentbased_always_on, when unset).
    The SDK itself would only warn of a mistyped one and sample everything: here it stops the process."""
    name = environ.get(SAMPLER_VARIABLE, "parentbased_always_on").strip().lower()
    fixed = {
        "always_on": ALWAYS_ON,
        "always_off": ALWAYS_OFF,
        "parentbased_always_on": ParentBased(ALWAYS_ON),
        "parentbased_always_off": ParentBased(ALWAYS_OFF),
    }
    if name in fixed:
        return fixed[name]
    if name not in {"traceidratio", "parentbased_traceidratio"}:
        known = ", ".join(sorted([*fixed, "traceidratio", "parentbased_traceidratio"]))
        raise TracingConfigurationError(f"{SAMPLER_VARIABLE}={name}: not one of {known}")
    ratio = _ratio(environ.get(SAMPLER_ARG_VARIABLE, "1.0"))
    return TraceIdRatioBased(ratio) if name == "traceidratio" else ParentBased(TraceIdRatioBased(ratio))


def _ratio(text: str) -> float:
    try:
        ratio = float(text)
    except ValueError:
        ratio = -1.0
    if not 0.0 <= ratio <= 1.0:
        raise TracingConfigurationError(f"{SAMPLER_ARG_VARIABLE}={text}: a ratio between 0 and 1")
    return ratio


def tracer(component: str) -> trace.Tracer:
    return trace.get_tracer(f"pin_identity.{component}")


@contextmanager
def traced(
    component_tracer: trace.Tracer,
    name: str,
    attributes: Mapping[str, AttributeValue] | None = None,
    *,
    context: otel_context.Context | None = None,
) -> Iterator[trace.Span]:
    """A span around the block, current inside it. An exception that leaves the block marks the span failed
    with `describe_error`'s description: the SDK would record the whole message and traceback, and a
    database error's detail lines quote the row it refused (PII) to the trace backend."""
    with component_tracer.start_as_current_span(
        name, context=context, attributes=attributes, record_exception=False, set_status_on_exception=False
    ) as span:
        try:
            yield span
        except Exception as exc:
            failed(span, exc)
            raise


def failed(span: trace.Span, exc: BaseException) -> None:
    """The span ended in a failure, described without the values it may quote."""
    span.set_status(Status(StatusCode.ERROR, describe_error(exc)))


def current_traceparent() -> str | None:
    """The W3C traceparent of the active span, for the events it produces; None when tracing is off."""
    if not trace.get_current_span().get_span_context().is_valid:
        return None
    carrier: dict[str, str] = {}
    _propagator.inject(carrier)
    return carrier.get("traceparent")


# ---------------------------------------------------------------- an import run's trace

# The ids the next span started in this context takes (trace id, span id); unset: random ones.
_CHOSEN: contextvars.ContextVar[tuple[int, int] | None] = contextvars.ContextVar("chosen_ids", default=None)


class _ChosenIds(RandomIdGenerator):
    """Random ids, except for a span started under `_chosen_ids` (an import's run and stage spans)."""

    def generate_trace_id(self) -> int:
        chosen = _CHOSEN.get()
        return chosen[0] if chosen else super().generate_trace_id()

    def generate_span_id(self) -> int:
        chosen = _CHOSEN.get()
        return chosen[1] if chosen else super().generate_span_id()


def _derived(correlation_id: UUID, part: str, bits: int) -> int:
    """An id derived from the run's CorrelationId: the same in every process, never 0. Hashed rather than
    the uuid itself, whose fixed version and variant bits would bias a trace-id-ratio sampler."""
    digest = blake2b(f"{correlation_id}:{part}".encode(), digest_size=bits // 8).digest()
    return int.from_bytes(digest, "big") or 1


@dataclass(frozen=True)
class ImportTrace:
    """An import run's trace: run span -> stage span -> page spans (-> read and write spans), the ids of the
    first two derived from the run's CorrelationId."""

    correlation_id: UUID

    @property
    def trace_id(self) -> int:
        return _derived(self.correlation_id, "trace", 128)

    def run_span_id(self) -> int:
        return _derived(self.correlation_id, "run", 64)

    def stage_span_id(self, stage: str) -> int:
        return _derived(self.correlation_id, f"stage:{stage}", 64)

    def _context(self, span_id: int) -> otel_context.Context:
        """A context whose current span is the run's or a stage's, as another process sees it (remote)."""
        flags = TraceFlags(TraceFlags.SAMPLED if self._sampled() else TraceFlags.DEFAULT)
        parent = SpanContext(self.trace_id, span_id, is_remote=True, trace_flags=flags)
        return trace.set_span_in_context(NonRecordingSpan(parent))

    def _sampled(self) -> bool:
        """The sampler's decision for the run's root span, which every process takes alike (it depends on the
        trace id only, for the standard samplers)."""
        provider = trace.get_tracer_provider()
        if not isinstance(provider, TracerProvider):
            return False
        decision = provider.sampler.should_sample(None, self.trace_id, "talent-import.run").decision
        return decision in {Decision.RECORD_AND_SAMPLE}

    def stage_context(self, stage: str) -> otel_context.Context:
        """The parent of a page span of `stage`."""
        return self._context(self.stage_span_id(stage))

    def write_run_span(
        self, started_at: datetime, ended_at: datetime, attributes: Mapping[str, AttributeValue]
    ) -> None:
        """The run's root span, written once the run ended, by the process that ended it."""
        _write_span(
            "talent-import.run",
            (self.trace_id, self.run_span_id()),
            otel_context.Context(),
            (started_at, ended_at),
            attributes,
        )

    def write_stage_span(
        self, stage: str, started_at: datetime, ended_at: datetime, attributes: Mapping[str, AttributeValue]
    ) -> None:
        """A stage's span, child of the run's, written once every page of the stage is Done."""
        _write_span(
            "talent-import.stage",
            (self.trace_id, self.stage_span_id(stage)),
            self._context(self.run_span_id()),
            (started_at, ended_at),
            attributes,
        )


def write_import_run_span(run: ImportRun, status: RunStatus, ended_at: datetime) -> None:
    """The run's root span, written by whoever ended the run (its orchestrator, or an operator's cancel):
    once, as a run ends once."""
    attributes: dict[str, AttributeValue] = {
        **_run_attributes(run),
        "mode": run.mode.value,
        "status": status.value,
        "dryRun": run.dry_run,
    }
    ImportTrace(run.correlation_id).write_run_span(run.started_at, ended_at, attributes)


def write_import_stage_span(run: ImportRun, stage: ImportStage, times: tuple[datetime, datetime]) -> None:
    """A stage's span, written once every page of the stage is Done."""
    attributes = {**_run_attributes(run), "stage": stage.value}
    ImportTrace(run.correlation_id).write_stage_span(stage.value, *times, attributes)


def _run_attributes(run: ImportRun) -> dict[str, AttributeValue]:
    return {"runId": str(run.run_id), "correlationId": str(run.correlation_id)}


def _write_span(
    name: str,
    ids: tuple[int, int],
    parent: otel_context.Context,
    times: tuple[datetime, datetime],
    attributes: Mapping[str, AttributeValue],
) -> None:
    started_at, ended_at = times
    token = _CHOSEN.set(ids)
    try:
        span = _import_tracer.start_span(
            name, context=parent, attributes=attributes, start_time=_nanoseconds(started_at)
        )
    finally:
        _CHOSEN.reset(token)
    span.end(end_time=_nanoseconds(max(ended_at, started_at)))


def import_page_span(run: ImportRun, page: ImportPage) -> AbstractContextManager[trace.Span]:
    """The span of one import page, a child of its stage's span (written by whoever ends the stage)."""
    attributes = {
        **_run_attributes(run),
        "stage": page.stage.value,
        "pageNo": page.page_no,
        "attempt": page.attempt,
        "dryRun": run.dry_run,
    }
    context = ImportTrace(run.correlation_id).stage_context(page.stage.value)
    return traced(_import_tracer, "talent-import.page", attributes, context=context)


def _nanoseconds(moment: datetime) -> int:
    return int(moment.timestamp() * 1_000_000) * 1000


_import_tracer = tracer("talent-import")
