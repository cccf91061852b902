"""OpenTelemetry at the server's edge: a SERVER span per request, its children made
after the fact from the measured times, and the request metrics.

The span tree of a generation (``attempt`` spans come from the gateway, app/core/gateway/telemetry.py)::

    POST /v1/chat/completions          SERVER, continues a client's traceparent
      attempt                          one per target the gateway tried, in order
      model_load                       the wait for the model (a JIT load, or another's)
      queue_wait                       waiting for a free sequence of the model
      prompt_processing                the prompt's prefill
      generation                       decoding, to the final token

Off (``create_app`` installs nothing: no middleware, no provider) unless a :class:`Telemetry`
is given or ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set. Attributes are bounded values only: route
templates (``unmatched`` for any other path), model labels by the Prometheus labels' rule
(app/server/routes/metrics.py ``known_model``), provider names, error codes, counts and times. Never
prompt or output text, key names or values, client addresses, user agents or raw paths.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from aiohttp import web
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from app.core.gateway.telemetry import PROPAGATOR, Scope, Telemetry, error_type
from app.core.types import Delta, Timings
from app.errors import GenerationCancelled
from app.server import records
from app.server.routes.metrics import METRICS, STATUS_CLASSES, UNMATCHED_ROUTE, status_class
from app.server.state import REQUEST_LOG, SERVICE, context_of

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

NO_MODEL = "none"
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "PATCH"})
CACHE_RESULTS = frozenset({"hit", "semantic", "miss", "bypass"})
SHUTDOWN_WAIT_S = 10.0  # a collector that is gone holds the server's stop this long at most

SCOPE = web.AppKey("telemetry_scope", Scope)
SPAN = web.RequestKey("hearth_span", Span)
_STARTED_NS = web.RequestKey("hearth_span_started_ns", int)
_GENERATIONS = web.RequestKey("hearth_span_generations", list)  # (ended at ns, Timings)


def series_bound(route_patterns: int, known_models: int, providers: int) -> int:
    """The most metric series (distinct attribute sets) the instruments can have::

        2*R*S + 3*M + M*P

    R = route patterns + 1 (``unmatched``), S = 5 status classes: requests and duration by
    route and status class; M = known models + 2 (``other``, ``none``): TTFT by model, tokens
    by model and direction; P = providers + 1 (``local``): fallbacks by model and provider.
    """
    r, s, m, p = route_patterns + 1, len(STATUS_CLASSES), known_models + 2, providers + 1
    return 2 * r * s + 3 * m + m * p


def middlewares(tele: Telemetry | None) -> list[Any]:
    """The tracing middleware (outermost, so refused requests are traced too) when on."""
    return [] if tele is None else [_traced]


def install(app: web.Application, tele: Telemetry | None, *, owned: bool) -> None:
    """Bind ``tele`` to the app's service when it starts; shut it down (flushing what is
    queued) when the app stops, if ``owned`` (made from the environment)."""
    if tele is None:
        return

    async def ctx(app: web.Application) -> AsyncIterator[None]:
        service = app[SERVICE]
        labels = app[METRICS].requests  # metrics' cleanup context ran first: the same rule

        def model_label(model_id: str) -> str:
            return labels.model_label(model_id) or NO_MODEL

        app[SCOPE] = Scope(tele, model_label, lambda m: records.provider_of(service, m))
        try:
            yield
        finally:
            if owned:
                await _shutdown(tele)

    app.cleanup_ctx.append(ctx)


async def _shutdown(tele: Telemetry) -> None:
    """``tele.shutdown()`` in a thread of its own: the exporters block, and a collector on
    this very loop (tests) must still be able to answer."""
    done = asyncio.Event()
    loop = asyncio.get_running_loop()

    def run() -> None:
        try:
            tele.shutdown()
        finally:
            loop.call_soon_threadsafe(done.set)

    threading.Thread(target=run, name="otel-shutdown", daemon=True).start()
    try:
        await asyncio.wait_for(done.wait(), SHUTDOWN_WAIT_S)
    except TimeoutError:
        pass  # the thread ends on its own; the server does not wait for a lost collector


def route_template(request: web.Request) -> str | None:
    """The matched route's template; None when no route matched (404, 405)."""
    resource = request.match_info.route.resource
    if resource is None or request.match_info.http_exception is not None:
        return None
    return resource.canonical


@web.middleware
async def _traced(request: web.Request, handler: Handler) -> web.StreamResponse:
    scope = request.app[SCOPE]
    tracer = scope.telemetry.tracer
    method = request.method if request.method in METHODS else "_OTHER"
    route = route_template(request)
    attrs: dict[str, Any] = {
        "http.request.method": method,
        "hearth.protocol": records.protocol_of(request),
    }
    if route is not None:
        attrs["http.route"] = route
    parent = PROPAGATOR.extract(request.headers)  # a client's traceparent: its trace goes on
    started = time.time_ns()
    span = tracer.start_span(
        f"{method} {route}" if route is not None else UNMATCHED_ROUTE,
        context=parent,
        kind=SpanKind.SERVER,
        attributes=attrs,
        start_time=started,
    )
    request[SPAN], request[_STARTED_NS], request[_GENERATIONS] = span, started, []
    sc = span.get_span_context()
    if sc.is_valid:
        request[records.TRACE_ID] = trace.format_trace_id(sc.trace_id)
    token = otel_context.attach(trace.set_span_in_context(span, parent))
    context_of(request).trace = scope  # the gateway's attempts and the providers' traceparent
    status = 500
    try:
        resp = await handler(request)
        status = resp.status
        return resp
    except web.HTTPException as e:  # a redirect the edge lets through
        status = e.status
        raise
    except asyncio.CancelledError:  # the client went away (or the server is stopping)
        status = GenerationCancelled.status
        raise
    finally:
        otel_context.detach(token)
        _finish(request, scope, span, route, status)


def note_generation(request: web.Request, final: Delta) -> None:
    """A generation ended now: its measured phases become spans when the request ends."""
    gens = request.get(_GENERATIONS)
    if gens is not None and final.timings is not None:
        gens.append((time.time_ns(), final.timings))


def _finish(request: web.Request, scope: Scope, span: Span, route: str | None, status: int) -> None:
    """The request's outcome on its span, its phase spans, its metrics; the span ends."""
    info: dict[str, Any] = request.get(REQUEST_LOG) or {}
    requested = info.get("requested_model") or info.get("model")
    answered = info.get("answered_by")
    label = scope.model_label
    a: dict[str, Any] = {
        "http.response.status_code": status,
        "hearth.stream": bool(info.get("stream")),
        "gen_ai.usage.input_tokens": int(info.get("prompt_tokens") or 0),
        "gen_ai.usage.output_tokens": int(info.get("completion_tokens") or 0),
        "hearth.cached_tokens": int(info.get("cached_tokens") or 0),
    }
    if isinstance(requested, str):
        a["gen_ai.request.model"] = label(requested)
    if isinstance(answered, str):
        a["gen_ai.response.model"] = label(answered)
        provider = scope.provider_of(answered)
        if provider:
            a["hearth.provider"] = provider
    ttft_ms = info.get("ttft_ms")
    if ttft_ms is not None:
        a["hearth.ttft_ms"] = float(ttft_ms)
    if info.get("cache") in CACHE_RESULTS:
        a["hearth.cache"] = info["cache"]
    code = info.get("error_code")
    if code is not None or status >= 400:
        a["error.type"] = error_type(code) if code is not None else str(status)
    span.set_attributes(a)
    if status >= 500:  # a server span's 4xx is the client's error, not the server's
        span.set_status(Status(StatusCode.ERROR, a["error.type"]))
    _phases(request, scope, span)
    ended = time.time_ns()
    span.end(end_time=ended)

    tele = scope.telemetry
    route_attrs = {
        "http.route": route or UNMATCHED_ROUTE,
        "hearth.status_class": status_class(status),
    }
    tele.requests.add(1, route_attrs)
    tele.duration.record((ended - request[_STARTED_NS]) / 1e9, route_attrs)
    model = (
        label(answered) if isinstance(answered, str) else a.get("gen_ai.request.model", NO_MODEL)
    )
    if ttft_ms is not None:
        tele.ttft.record(float(ttft_ms) / 1000.0, {"hearth.model": model})
    for kind, n in (
        ("input", a["gen_ai.usage.input_tokens"]),
        ("output", a["gen_ai.usage.output_tokens"]),
    ):
        if n:
            tele.tokens.add(n, {"hearth.model": model, "gen_ai.token.type": kind})


def _phases(request: web.Request, scope: Scope, span: Span) -> None:
    """The measured waits as child spans with explicit times: the model's load from when its
    wait began; each generation's queue wait, prompt processing and decoding counted back from
    when its final delta came."""
    tracer = scope.telemetry.tracer
    parent = trace.set_span_in_context(span)
    floor = request[_STARTED_NS]

    def child(name: str, start: int, end: int, attrs: dict[str, Any] | None = None) -> None:
        start = max(floor, start)
        s = tracer.start_span(name, context=parent, start_time=start, attributes=attrs)
        s.end(end_time=max(start, end))

    timing = records.timing_of(request)
    if timing.load_ms is not None and timing.load_started_ns is not None:
        child("model_load", timing.load_started_ns, timing.load_started_ns + _ns(timing.load_ms))
    t: Timings
    for ended, t in request[_GENERATIONS]:
        gen_start = ended - _ns(t.predicted_ms)
        prompt_start = gen_start - _ns(t.prompt_ms)
        child("queue_wait", prompt_start - _ns(t.queue_ms), prompt_start)
        child(
            "prompt_processing",
            prompt_start,
            gen_start,
            {"gen_ai.usage.input_tokens": t.prompt_n, "hearth.cached_tokens": t.cache_n},
        )
        child("generation", gen_start, ended, {"gen_ai.usage.output_tokens": t.predicted_n})


def _ns(ms: float) -> int:
    return int(max(0.0, ms) * 1e6)
