"""OpenTelemetry: the tracer and meter of one server, and the core's side of a
request's trace (one span per gateway attempt, ``traceparent`` for the providers).

Off unless ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set: then :meth:`Telemetry.from_env` builds an
OTLP/HTTP exporter for spans (batched) and metrics (a periodic reader), configured by the
standard ``OTEL_*`` variables the SDK reads. No global provider is installed: the server holds
its own, and puts the request's :class:`Scope` on its context (``RequestContext.trace``), which
the gateway and the remote client read; an untraced request carries None and costs nothing.

Nothing here records free text: a span's attributes are bounded values (model labels through
the server's rule, operator-configured provider names, error codes), never messages.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from opentelemetry.propagators.textmap import TextMapPropagator
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SimpleSpanProcessor,
    SpanExporter,
)
from opentelemetry.trace import Span, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from app.errors import HearthError

log = logging.getLogger(__name__)

ENDPOINT_ENV = "OTEL_EXPORTER_OTLP_ENDPOINT"
SERVICE_NAME = "hearth"
# seconds, as app/server/routes/metrics.py buckets the Prometheus histograms
DURATION_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
# only W3C trace context travels: traceparent and tracestate (no baggage, whatever a client sends)
PROPAGATOR: TextMapPropagator = TraceContextTextMapPropagator()
_CODE = re.compile(r"[a-z][a-z0-9_]{0,63}")


def error_type(code: str | None) -> str:
    """An error code as an attribute: the codes are class constants; anything else is "other"."""
    return code if code is not None and _CODE.fullmatch(code) else "other"


class Telemetry:
    """One server's tracer and meter, and its instruments (names and units in the README)."""

    def __init__(self, tracer_provider: TracerProvider, meter_provider: MeterProvider) -> None:
        self.tracer_provider = tracer_provider
        self.meter_provider = meter_provider
        self.tracer = tracer_provider.get_tracer("hearth")
        meter = meter_provider.get_meter("hearth")
        self.requests = meter.create_counter(
            "hearth.server.requests", unit="{request}", description="HTTP requests"
        )
        self.duration = meter.create_histogram(
            "hearth.server.request.duration",
            unit="s",
            description="Time from a request's arrival to the end of its response",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
        )
        self.ttft = meter.create_histogram(
            "hearth.server.time_to_first_token",
            unit="s",
            description="Time from a request's arrival to its first generated token",
            explicit_bucket_boundaries_advisory=TTFT_BUCKETS,
        )
        self.tokens = meter.create_counter(
            "hearth.tokens",
            unit="{token}",
            description="Prompt (input) and completion (output) tokens",
        )
        self.fallbacks = meter.create_counter(
            "hearth.fallbacks",
            unit="{attempt}",
            description="Failed attempts after which the gateway tried the route's next target",
        )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Telemetry | None:
        """OTLP/HTTP exporters when ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set (and
        ``OTEL_SDK_DISABLED`` is not true); None otherwise: tracing is off.

        The exporters, the batch span processor, the periodic reader and the sampler read the
        rest of the standard ``OTEL_*`` variables themselves (``OTEL_EXPORTER_OTLP_HEADERS``,
        ``OTEL_BSP_*``, ``OTEL_METRIC_EXPORT_INTERVAL``, ``OTEL_TRACES_SAMPLER``...); a signal
        whose ``OTEL_TRACES_EXPORTER`` / ``OTEL_METRICS_EXPORTER`` is ``none`` is not exported.
        """
        env = os.environ if environ is None else environ
        if not env.get(ENDPOINT_ENV, "").strip():
            return None
        if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
            return None
        # imported only when on: the exporters pull in requests and protobuf
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        resource = _resource()
        tracer_provider = TracerProvider(resource=resource)
        if env.get("OTEL_TRACES_EXPORTER", "").strip().lower() != "none":
            tracer_provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        readers: list[MetricReader] = []
        if env.get("OTEL_METRICS_EXPORTER", "").strip().lower() != "none":
            readers.append(PeriodicExportingMetricReader(OTLPMetricExporter()))
        where = urllib.parse.urlsplit(env[ENDPOINT_ENV].strip())
        log.info("OpenTelemetry on: OTLP/HTTP to %s", where.hostname or "?")  # no credentials
        return cls(tracer_provider, MeterProvider(metric_readers=readers, resource=resource))

    @classmethod
    def exporting_to(cls, spans: SpanExporter, reader: MetricReader) -> Telemetry:
        """A seam for tests: spans exported as each ends (an ``InMemorySpanExporter``), metrics
        read by ``reader`` (an ``InMemoryMetricReader``); no environment variable involved."""
        resource = _resource()
        tracer_provider = TracerProvider(resource=resource)
        tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
        return cls(tracer_provider, MeterProvider(metric_readers=[reader], resource=resource))

    def shutdown(self) -> None:
        """Flush what is queued and stop the exporters (blocking: call it off the loop)."""
        for shut in (self.tracer_provider.shutdown, self.meter_provider.shutdown):
            try:
                shut()
            except Exception:  # a collector that is gone must not stop the server stopping
                log.exception("OpenTelemetry shutdown failed")


def _resource() -> Resource:
    """The SDK's resource (OTEL_RESOURCE_ATTRIBUTES, OTEL_SERVICE_NAME), named "hearth" when
    neither names the service."""
    from app import __version__

    r = Resource.create({"service.version": __version__})
    name = str(r.attributes.get("service.name", ""))
    if not name or name.startswith("unknown_service"):
        r = r.merge(Resource({"service.name": SERVICE_NAME}))
    return r


@dataclass(frozen=True, slots=True)
class Scope:
    """What the core's spans need from the server serving the request: its telemetry and the
    one rule for bounded model labels (``model_label``: a known model's id, else "other"), and
    the provider (operator-configured name, or "local") of a model id."""

    telemetry: Telemetry
    model_label: Callable[[str], str]
    provider_of: Callable[[str], str | None]


def attrs_of(scope: Scope, model_id: str) -> dict[str, str]:
    """The bounded attributes of a target: its model label and provider."""
    out = {"gen_ai.request.model": scope.model_label(model_id)}
    provider = scope.provider_of(model_id)
    if provider:
        out["hearth.provider"] = provider
    return out


@contextlib.contextmanager
def attempt(scope: Scope | None, target: str, index: int) -> Iterator[Span | None]:
    """One gateway attempt at ``target`` as a span (a child of the request's), current while
    it starts, so a provider's request carries it in its ``traceparent``. Its status is the
    error code of a failure (never the message, which may quote the request)."""
    if scope is None:
        yield None
        return
    attrs: dict[str, str | int] = {**attrs_of(scope, target), "hearth.attempt": index}
    with scope.telemetry.tracer.start_as_current_span(
        "attempt", attributes=attrs, record_exception=False, set_status_on_exception=False
    ) as span:
        try:
            yield span
        except HearthError as e:
            code = error_type(e.code)
            span.set_attribute("error.type", code)
            span.set_status(Status(StatusCode.ERROR, code))
            raise


def fell_back(scope: Scope | None, target: str) -> None:
    """``target`` failed and the gateway moves on to the route's next one."""
    if scope is not None:
        scope.telemetry.fallbacks.add(1, attrs_of(scope, target))


def trace_headers(scope: Scope | None) -> dict[str, str] | None:
    """``traceparent`` (and ``tracestate``) of the current span, for a request to a provider;
    None when the request is not traced."""
    if scope is None:
        return None
    carrier: dict[str, str] = {}
    PROPAGATOR.inject(carrier)
    return carrier or None
