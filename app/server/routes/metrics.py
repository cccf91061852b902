"""``GET /api/v1/metrics`` (JSON) and ``GET /metrics`` (Prometheus text), both fed by the
RequestFinished events the edge middleware publishes.

Prometheus labels are bounded and never free text: ``route`` is a registered route pattern
(``unmatched`` for any path no route matched), ``status_class`` one of 1xx..5xx, ``model`` a
library or provider model id or an alias (``other`` for any other name, ``none`` when the request named no
model). The series are at most (see ``series_bound``)::

    2*R*S*M + (D+3)*R + (T+3)*M + 4*M + 7   (+ 3 with shared state)

with R = route patterns + 1, S = 5 status classes, M = known models (and aliases) + 2, D and T the bucket
counts (with +Inf) of the duration and TTFT histograms (a counter child exposes ``_total`` and
``_created``; a histogram child its buckets, ``_count``, ``_sum`` and ``_created``). With
shared state, ``hearth_state_errors_total`` counts failed calls to Redis and ``hearth_state_up``
is 1 while it answers, 0 while degraded (3 series; none without shared state).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from app.core.events import RequestFinished
from app.core.gateway.metrics import OTHER_MODEL, RequestMetrics
from app.core.service import Hearth
from app.core.util import access
from app.errors import HearthError, ModelNotFound
from app.server.routes.health import health_state
from app.server.state import SERVICE, STATE, scope_of

log = logging.getLogger(__name__)

UNMATCHED_ROUTE = "unmatched"
NO_MODEL = "none"
STATUS_CLASSES = ("1xx", "2xx", "3xx", "4xx", "5xx")
HEALTH_STATES = ("starting", "ready", "busy", "error", "shutting_down")
DURATION_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

routes = web.RouteTableDef()


def series_bound(route_patterns: int, known_models: int, shared: bool = False) -> int:
    """The most series ``/metrics`` can expose (the module docstring's formula)."""
    r, s, m = route_patterns + 1, len(STATUS_CLASSES), known_models + 2
    d, t = len(DURATION_BUCKETS) + 1, len(TTFT_BUCKETS) + 1
    state = 3 if shared else 0  # the shared state's error counter (_total, _created), up gauge
    return 2 * r * s * m + (d + 3) * r + (t + 3) * m + 4 * m + 2 + len(HEALTH_STATES) + state


def status_class(status: int) -> str:
    return STATUS_CLASSES[min(max(status // 100, 1), 5) - 1]


def known_model(service: Hearth) -> Callable[[str], bool]:
    """A library model id, a model a ready provider lists (``PREFIX/id``) or an alias: the one
    rule for a model's label (here and in the OpenTelemetry spans and metrics)."""

    def known(model_id: str) -> bool:
        # a remote model first, by its own provider's list: asked twice for every answer a
        # gateway gives, and that costs neither every provider's listing nor an exception
        with contextlib.suppress(HearthError):  # not ready, or not listed: the rule below
            if service.routing.remote_listing(model_id) is not None:
                return True
        try:
            service.models.get(model_id)
            return True
        except ModelNotFound:
            if model_id in service.routing.aliases():  # operator-configured names
                return True
            return any(r.id == model_id for r in service.routing.remote_models())

    return known


def shown_to_caller(service: Hearth, scope: tuple[str, ...] | None) -> Callable[[str | None], bool]:
    """Whether a key with model patterns ``scope`` may see a model label's series: an alias it
    reaches, a model in its scope, or a label that names no model (everything without one)."""
    if not scope:
        return lambda _label: True
    every_alias = service.routing.aliases()
    visible = service.routing.aliases(scope)

    def shown(label: str | None) -> bool:
        if label is None or label in (OTHER_MODEL, NO_MODEL):
            return True
        if label in every_alias:
            return label in visible
        return access.in_scope(label, scope)

    return shown


class _Visible(Collector):
    """A registry's samples less those whose ``model`` label ``shown`` refuses."""

    def __init__(self, registry: CollectorRegistry, shown: Callable[[str | None], bool]) -> None:
        self._registry = registry
        self._shown = shown

    def collect(self) -> Iterable[Metric]:
        for metric in self._registry.collect():
            kept = Metric(metric.name, metric.documentation, metric.type, metric.unit)
            kept.samples = [s for s in metric.samples if self._shown(s.labels.get("model"))]
            yield kept


class ServerMetrics:
    """One server's metrics: the JSON tallies and a Prometheus registry of its own."""

    def __init__(
        self,
        known: Callable[[str], bool],
        route_patterns: Iterable[str],
        shared: Any = None,
    ) -> None:
        self.requests = RequestMetrics(known)
        self.routes = frozenset(route_patterns)
        self.registry = r = CollectorRegistry()
        self._requests = Counter(
            "hearth_requests",
            "HTTP requests by route pattern, status class and model",
            ["route", "status_class", "model"],
            registry=r,
        )
        self._duration = Histogram(
            "hearth_request_duration_seconds",
            "Time from a request's arrival to the end of its response",
            ["route"],
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self._ttft = Histogram(
            "hearth_time_to_first_token_seconds",
            "Time from a request's arrival to its first generated token",
            ["model"],
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self._tokens = Counter(
            "hearth_tokens",
            "Prompt (in) and completion (out) tokens",
            ["model", "direction"],
            registry=r,
        )
        self.uptime = Gauge("hearth_uptime_seconds", "Seconds since the server started", registry=r)
        self.inflight = Gauge("hearth_requests_in_flight", "Requests being handled", registry=r)
        self.state = Gauge(
            "hearth_health_state", "1 for /health's current state", ["state"], registry=r
        )
        self._children: dict[tuple[Any, ...], Any] = {}  # _child's
        self.shared = shared  # the shared state (app.redis_state's SharedState), or None
        if shared is not None:
            self._state_errors = Counter(
                "hearth_state_errors", "Failed calls to the shared state (Redis)", registry=r
            )
            self._state_up = Gauge(
                "hearth_state_up", "1 while the shared state answers, 0 while not", registry=r
            )
            self._errors_seen = 0

    def observe_shared(self) -> None:
        """Bring the shared state's series up to date (at each scrape)."""
        if self.shared is None:
            return
        errors = self.shared.errors
        self._state_errors.inc(max(0, errors - self._errors_seen))
        self._errors_seen = max(errors, self._errors_seen)
        self._state_up.set(1 if self.shared.healthy else 0)

    def observe(self, event: object) -> None:
        """An EventHub listener (RequestFinished only)."""
        if not isinstance(event, RequestFinished):
            return
        label = self.requests.model_label(event.model)
        self.requests.add(event, label)
        route = event.route if event.route in self.routes else UNMATCHED_ROUTE
        model = label or NO_MODEL
        self._child(self._requests, route, status_class(event.status), model).inc()
        self._child(self._duration, route).observe(event.seconds)
        if event.ttft_ms is not None:
            self._child(self._ttft, model).observe(event.ttft_ms / 1000.0)
        if event.prompt_tokens:
            self._child(self._tokens, model, "in").inc(event.prompt_tokens)
        if event.completion_tokens:
            self._child(self._tokens, model, "out").inc(event.completion_tokens)

    def _child(self, metric: Any, *values: str) -> Any:
        """``metric.labels(*values)``, kept: the labels' sets are bounded (routes, status
        classes, known models), and prometheus_client's lookup takes a lock and checks the
        values every time (five a request)."""
        key = (id(metric), *values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*values)
        return child


METRICS = web.AppKey("metrics", ServerMetrics)


def install(app: web.Application) -> None:
    """Mount both metrics routes and feed them from the service's events while serving."""
    app.router.add_routes(routes)
    app.cleanup_ctx.append(_subscribed)


async def _subscribed(app: web.Application) -> AsyncIterator[None]:
    # the router is frozen by now: its patterns are the route label's whole set
    patterns = [res.canonical for res in app.router.resources()]
    metrics = ServerMetrics(known_model(app[SERVICE]), patterns, app[SERVICE].shared)
    app[METRICS] = metrics
    unsubscribe = app[SERVICE].events.subscribe(metrics.observe)
    try:
        yield
    finally:
        unsubscribe()


@routes.get("/api/v1/metrics")
async def metrics_json(request: web.Request) -> web.Response:
    snapshot = request.app[METRICS].requests.snapshot()
    shown = shown_to_caller(request.app[SERVICE], scope_of(request))
    snapshot["models"] = {m: t for m, t in snapshot["models"].items() if shown(m)}
    return web.json_response(snapshot)


@routes.get("/metrics")
async def metrics_text(request: web.Request) -> web.Response:
    m = request.app[METRICS]
    m.uptime.set(time.monotonic() - m.requests.started)
    m.inflight.set(max(0, request.app[STATE].inflight - 1))  # not counting this scrape
    current = health_state(request.app[STATE], request.app[SERVICE])
    for s in HEALTH_STATES:
        m.state.labels(s).set(1 if s == current else 0)
    m.observe_shared()
    visible = CollectorRegistry()  # this scrape's view: the caller's models' series only
    visible.register(_Visible(m.registry, shown_to_caller(request.app[SERVICE], scope_of(request))))
    body = generate_latest(visible)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


__all__ = ["METRICS", "OTHER_MODEL", "ServerMetrics", "install", "series_bound"]
