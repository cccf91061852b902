"""OpenTelemetry: a SERVER span per request with its measured phases and gateway
attempts as children, a client's traceparent continued and sent on to providers, metrics with
bounded attributes, nothing of the content recorded, and nothing at all unless it is turned on.

The real aiohttp app on a loopback port over the real Worker (a scripted engine for speed), real
aiohttp upstreams as providers, and the SDK's own in-memory exporters (the seam
``Telemetry.exporting_to``); the environment path exports to a real OTLP/HTTP receiver.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from app.core.gateway.aliases import AliasStore
from app.core.gateway.providers.pool import ProviderPool
from app.core.gateway.providers.store import ProviderConfig, ProviderStore
from app.core.gateway.records import RecordStore, read_records
from app.core.gateway.telemetry import Telemetry
from app.core.library.index import ModelLibrary
from app.core.service import Hearth, assemble
from app.core.types import LoadOptions
from app.runtimes.remote.client import RemoteEngine
from app.server import telemetry as server_telemetry
from app.server.app import create_app
from app.server.middleware import edge_middleware
from app.server.records import RECORDER, Recorder
from app.server.routes import metrics as server_metrics
from app.settings import ServerSettings, hash_key
from tests.conftest import listen_loopback
from tests.server.telemetry.traffic import CANARY, ask, mixed
from tests.support.fakes import FakeRuntime
from tests.support.gguf_files import write_model

KEY = "sk-otel-test"
AUTH = {"Authorization": f"Bearer {KEY}"}
CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"
PHASES = ("model_load", "queue_wait", "prompt_processing", "generation")


@dataclass
class Served:
    s: aiohttp.ClientSession
    model: str
    app: web.Application
    service: Hearth
    spans: InMemorySpanExporter
    reader: InMemoryMetricReader
    records: Path
    upstream_seen: dict[str, list[str | None]] = field(default_factory=dict)

    def finished(self) -> list[ReadableSpan]:
        return list(self.spans.get_finished_spans())

    def points(self) -> dict[str, list[Any]]:
        """Each metric's data points, by name."""
        out: dict[str, list[Any]] = {}
        data = self.reader.get_metrics_data()
        for rm in data.resource_metrics if data else ():
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    out.setdefault(m.name, []).extend(m.data.data_points)
        return out


@contextlib.asynccontextmanager
async def app_with(
    tmp_path: Path,
    *,
    telemetry: Telemetry | None = None,
    api_key: str | None = None,
    providers: ProviderPool | None = None,
    aliases: AliasStore | None = None,
) -> AsyncIterator[Served]:
    lib = ModelLibrary(tmp_path / "lib.json", tmp_path / "models")
    lib.import_path(write_model(tmp_path / "src" / "tiny.gguf"))
    (model,) = lib.list()
    h = assemble(
        lib,
        {"gguf": FakeRuntime(delay=0.0)},
        load_defaults=LoadOptions,
        providers=providers,
        aliases=aliases,
    )
    spans, reader = InMemorySpanExporter(), InMemoryMetricReader()
    tele = telemetry if telemetry is not None else Telemetry.exporting_to(spans, reader)
    hashes = (hash_key(api_key),) if api_key else ()
    app = create_app(h, ServerSettings(), api_key_hashes=hashes, telemetry=tele)
    db = tmp_path / "requests.db"
    app[RECORDER] = Recorder(RecordStore(db))
    try:
        async with TestServer(app, host="127.0.0.1") as server:
            root = str(server.make_url("")).rstrip("/")
            async with aiohttp.ClientSession(root, headers=AUTH if api_key else None) as s:
                yield Served(s, model.id, app, h, spans, reader, db)
    finally:
        await asyncio.to_thread(app[RECORDER].store.close)
        await h.close()


def by_name(spans: list[ReadableSpan], name: str) -> list[ReadableSpan]:
    return [x for x in spans if x.name == name]


def one_server_span(spans: list[ReadableSpan]) -> ReadableSpan:
    (server,) = [x for x in spans if x.kind is SpanKind.SERVER]
    return server


async def test_a_chat_request_is_a_server_span_with_its_phases_and_attempt(
    tmp_path: Path,
) -> None:
    async with app_with(tmp_path) as a:
        async with a.s.post("/v1/chat/completions", json=ask(a.model, "hi")) as r:
            assert r.status == 200
            usage = (await r.json())["usage"]
        spans = a.finished()
        points = a.points()
    server = one_server_span(spans)
    assert server.name == "POST /v1/chat/completions"
    assert server.parent is None  # no traceparent: a trace of its own
    ctx = server.context
    assert ctx is not None
    names = sorted(x.name for x in spans if x is not server)
    assert names == sorted(("attempt", *PHASES))
    assert server.start_time is not None and server.end_time is not None
    for child in spans:
        if child is server:
            continue
        assert child.parent is not None and child.parent.span_id == ctx.span_id, child.name
        assert child.context is not None and child.context.trace_id == ctx.trace_id
        assert child.start_time is not None and child.end_time is not None
        assert server.start_time <= child.start_time <= child.end_time <= server.end_time
    queue, prompt, gen = (by_name(spans, n)[0] for n in PHASES[1:])
    assert queue.end_time <= prompt.start_time <= prompt.end_time <= gen.start_time  # type: ignore[operator]
    assert gen.attributes is not None and gen.attributes["gen_ai.usage.output_tokens"] > 0
    attrs = dict(server.attributes or {})
    assert attrs["http.request.method"] == "POST"
    assert attrs["http.route"] == "/v1/chat/completions"
    assert attrs["http.response.status_code"] == 200
    assert attrs["hearth.protocol"] == "openai"
    assert attrs["hearth.stream"] is False
    assert attrs["gen_ai.request.model"] == attrs["gen_ai.response.model"] == a.model
    assert attrs["hearth.provider"] == "local"
    assert attrs["gen_ai.usage.input_tokens"] == usage["prompt_tokens"]
    assert attrs["gen_ai.usage.output_tokens"] == usage["completion_tokens"]
    assert attrs["hearth.ttft_ms"] > 0
    (attempt,) = by_name(spans, "attempt")
    assert dict(attempt.attributes or {}) == {
        "gen_ai.request.model": a.model,
        "hearth.provider": "local",
        "hearth.attempt": 0,
    }
    # the metrics: one request, its duration, its TTFT and its tokens, under bounded names
    (req,) = points["hearth.server.requests"]
    assert dict(req.attributes) == {
        "http.route": "/v1/chat/completions",
        "hearth.status_class": "2xx",
    }
    assert req.value == 1
    (dur,) = points["hearth.server.request.duration"]
    assert dur.count == 1 and 0 < dur.sum <= (server.end_time - server.start_time) / 1e9 + 1e-6
    (ttft,) = points["hearth.server.time_to_first_token"]
    assert dict(ttft.attributes) == {"hearth.model": a.model}
    assert ttft.count == 1 and ttft.sum == pytest.approx(attrs["hearth.ttft_ms"] / 1000)
    tokens = {p.attributes["gen_ai.token.type"]: p.value for p in points["hearth.tokens"]}
    assert tokens == {"input": usage["prompt_tokens"], "output": usage["completion_tokens"]}


async def test_a_client_traceparent_is_continued_and_the_record_has_the_trace_id(
    tmp_path: Path,
) -> None:
    async with app_with(tmp_path) as a:
        headers = {"traceparent": TRACEPARENT, "tracestate": "vendor=abc"}
        body = ask(a.model, "hi", stream=True)
        async with a.s.post("/v1/chat/completions", json=body, headers=headers) as r:
            assert r.status == 200
            await r.read()
        async with a.s.get("/nowhere/at/all") as r:  # traced too, under one name
            assert r.status == 404
        spans = a.finished()
    records = {r.route: r for r in read_records(a.records)}
    chat = next(x for x in spans if x.name == "POST /v1/chat/completions")
    assert chat.context is not None and chat.parent is not None
    assert format(chat.context.trace_id, "032x") == CLIENT_TRACE
    assert format(chat.parent.span_id, "016x") == CLIENT_SPAN and chat.parent.is_remote
    assert chat.context.trace_state.get("vendor") == "abc"
    assert dict(chat.attributes or {})["hearth.stream"] is True
    assert {x.name for x in spans if x.context.trace_id == chat.context.trace_id} >= {  # type: ignore[union-attr]
        "attempt",
        *PHASES,
    }
    assert records["/v1/chat/completions"].trace_id == CLIENT_TRACE
    unmatched = next(x for x in spans if x.name == "unmatched")
    assert unmatched.parent is None and unmatched.context is not None
    assert "http.route" not in (unmatched.attributes or {})
    (missing,) = [r for r in records.values() if r.status == 404]
    assert missing.trace_id == format(unmatched.context.trace_id, "032x")


# -- providers: a real upstream receives the trace; a fallback is one attempt span per target ----
def _sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


@contextlib.asynccontextmanager
async def upstream(seen: list[str | None], *, fail: bool) -> AsyncIterator[str]:
    """An OpenAI-compatible engine listing model ``m``; its chat answers 503 when ``fail``.
    ``seen`` gets the traceparent of each chat request."""

    async def models(_request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})

    async def chat(request: web.Request) -> web.StreamResponse:
        seen.append(request.headers.get("traceparent"))
        await request.read()
        if fail:
            return web.json_response({"error": {"message": "overloaded"}}, status=503)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(_sse({"choices": [{"index": 0, "delta": {"content": "ok"}}]}))
        usage = {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}
        await resp.write(
            _sse({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], "usage": usage})
        )
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", chat)
    runner, url = await listen_loopback(app)
    try:
        yield f"{url}/v1"
    finally:
        await runner.cleanup()


async def _until(cond: Any, what: str) -> None:
    for _ in range(3000):  # 30 s: liveness, not speed
        if cond():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never: {what}")


async def test_providers_get_the_trace_and_a_fallback_is_an_attempt_per_target(
    tmp_path: Path,
) -> None:
    bad_seen: list[str | None] = []
    good_seen: list[str | None] = []
    async with (
        upstream(bad_seen, fail=True) as bad_url,
        upstream(good_seen, fail=False) as good_url,
    ):
        store = ProviderStore(tmp_path / "providers.json", tmp_path / "provider-keys.json")
        store.add(ProviderConfig("bad", bad_url), None, lambda _p: None)
        store.add(ProviderConfig("good", good_url), None, lambda _p: None)
        aliases = AliasStore(tmp_path / "aliases.json")
        pool = ProviderPool(store, RemoteEngine)
        async with app_with(tmp_path, providers=pool, aliases=aliases) as a:
            await _until(
                lambda: len(a.service.routing.remote_models()) == 2, "both providers ready"
            )
            a.service.routing.set_alias("chain", ["bad/m", "good/m"])
            headers = {"traceparent": TRACEPARENT}
            async with a.s.post(
                "/v1/chat/completions", json=ask("chain", "hi"), headers=headers
            ) as r:
                assert r.status == 200, await r.text()
                assert r.headers["x-hearth-route"] == "bad/m,good/m"
                await r.read()
            spans = a.finished()
            a.spans.clear()
            async with a.s.post("/v1/chat/completions", json=ask("bad/m", "hi")) as r:
                assert r.status == 502  # one target, failed: an error, and no fallback
            failed = one_server_span(a.finished())
            points = a.points()
    assert len(bad_seen) == 2 and len(good_seen) == 1
    assert failed.status.status_code is StatusCode.ERROR
    assert failed.status.description == "provider_error" and not failed.events
    assert dict(failed.attributes or {})["error.type"] == "provider_error"
    server = one_server_span(spans)
    assert server.context is not None
    assert format(server.context.trace_id, "032x") == CLIENT_TRACE
    attempts = sorted(by_name(spans, "attempt"), key=lambda x: x.start_time or 0)
    assert [dict(x.attributes or {}).get("hearth.provider") for x in attempts] == ["bad", "good"]
    assert [dict(x.attributes or {})["gen_ai.request.model"] for x in attempts] == [
        "bad/m",
        "good/m",
    ]
    assert attempts[0].status.status_code is StatusCode.ERROR
    assert not attempts[0].events  # no exception event: its message quotes the upstream
    assert attempts[0].status.description == "provider_error"
    assert dict(attempts[0].attributes or {})["error.type"] == "provider_error"
    assert attempts[1].status.status_code is StatusCode.UNSET
    for x in attempts:
        assert x.parent is not None and x.parent.span_id == server.context.span_id
    # each provider saw the client's trace id, with its own attempt as the parent
    for seen, att in ((bad_seen, attempts[0]), (good_seen, attempts[1])):
        assert seen and seen[0] is not None, seen  # (bad saw the lone request's too)
        _, trace_id, parent_id, _ = seen[0].split("-")
        assert trace_id == CLIENT_TRACE
        assert att.context is not None and parent_id == format(att.context.span_id, "016x")
    attrs = dict(server.attributes or {})
    assert attrs["gen_ai.request.model"] == "chain"  # an alias: an operator-configured name
    assert attrs["gen_ai.response.model"] == "good/m" and attrs["hearth.provider"] == "good"
    (fallback,) = points["hearth.fallbacks"]
    assert fallback.value == 1
    assert dict(fallback.attributes) == {"gen_ai.request.model": "bad/m", "hearth.provider": "bad"}


# -- the canary ----------------------------------------------------------------------------------
def _dump_spans(spans: list[ReadableSpan]) -> str:
    return "\n".join(x.to_json() for x in spans)


async def test_300_mixed_requests_record_no_canary_and_bounded_series(tmp_path: Path) -> None:
    made_up: set[str] = set()
    async with app_with(tmp_path, api_key=KEY) as a:
        statuses = [await mixed(a.s, a.model, i, made_up) for i in range(300)]
        async with a.s.get("/metrics") as r:
            assert r.status == 200
            prometheus = await r.text()
        spans = a.finished()
        data = a.reader.get_metrics_data()
        assert data is not None
        metrics_json = data.to_json()
        points = a.points()
        patterns = {res.canonical for res in a.app.router.resources()}
        known = len(a.service.models._library.list())
    assert len(made_up) > 100
    assert {s // 100 for s in statuses} >= {2, 4}
    everything = {"spans": _dump_spans(spans), "metrics": metrics_json, "/metrics": prometheus}
    for where, text in everything.items():
        assert CANARY not in text, where
        leaked = sorted(n for n in made_up if n in text)
        assert not leaked, (where, leaked[:5])
        assert "10.1.0.9" not in text and "agent/" not in text, where  # no client address, UA
        assert KEY not in text, where
    # span names: route templates, "unmatched", the gateway's attempts and the phases only
    allowed = {f"{m} {p}" for m in ("GET", "POST", "DELETE", "OPTIONS") for p in patterns}
    allowed |= {"unmatched", "attempt", *PHASES}
    assert {x.name for x in spans} <= allowed
    assert len([x for x in spans if x.kind is SpanKind.SERVER]) == 301  # and the scrape
    for x in spans:
        for e in x.events:  # no exception events (their messages quote requests)
            raise AssertionError(f"{x.name} has an event {e.name}")
        assert x.status.description in (None, "", *_codes(spans)), x.status
    models = {
        v
        for x in spans
        for k, v in (x.attributes or {}).items()
        if k in ("gen_ai.request.model", "gen_ai.response.model")
    }
    assert models <= {a.model, "other"} and {a.model, "other"} <= models
    routes = {dict(p.attributes)["http.route"] for p in points["hearth.server.requests"]}
    assert routes <= patterns | {"unmatched"} and "unmatched" in routes
    series = sum(len(v) for v in points.values())
    bound = server_telemetry.series_bound(len(patterns), known, providers=0)
    r, m, p = len(patterns) + 1, known + 2, 1
    assert bound == 2 * r * 5 + 3 * m + m * p  # the documented formula
    assert 0 < series < bound
    assert server_metrics.series_bound(len(patterns), known) > 0  # the Prometheus bound holds
    # (routes/test_metrics.py checks the Prometheus side's series against its own bound)


def _codes(spans: list[ReadableSpan]) -> set[str]:
    return {str(v) for x in spans for k, v in (x.attributes or {}).items() if k == "error.type"}


# -- off unless turned on --------------------------------------------------------------------------
@pytest.fixture
def global_spans() -> Iterator[InMemorySpanExporter]:
    """An SDK provider installed globally (once per process): a span made through the global
    API by mistake would land here."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    exporter = InMemorySpanExporter()
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    provider.add_span_processor(SimpleSpanProcessor(exporter))  # type: ignore[union-attr]
    yield exporter
    exporter.shutdown()


async def test_off_without_the_env_var_no_span_is_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, global_spans: InMemorySpanExporter
) -> None:
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    assert Telemetry.from_env() is None
    seen: list[str | None] = []
    async with upstream(seen, fail=False) as url:
        store = ProviderStore(tmp_path / "providers.json", tmp_path / "provider-keys.json")
        store.add(ProviderConfig("up", url), None, lambda _p: None)
        lib = ModelLibrary(tmp_path / "lib.json", tmp_path / "models")
        lib.import_path(write_model(tmp_path / "src" / "tiny.gguf"))
        (model,) = lib.list()
        h = assemble(
            lib,
            {"gguf": FakeRuntime(delay=0.0)},
            load_defaults=LoadOptions,
            providers=ProviderPool(store, RemoteEngine),
        )
        app = create_app(h, ServerSettings())  # no telemetry given, none in the environment
        assert list(app.middlewares) == [edge_middleware]
        db = tmp_path / "requests.db"
        app[RECORDER] = Recorder(RecordStore(db))
        try:
            async with TestServer(app, host="127.0.0.1") as server:
                root = str(server.make_url("")).rstrip("/")
                async with aiohttp.ClientSession(root) as s:
                    await _until(lambda: len(h.routing.remote_models()) == 1, "the provider ready")
                    for m in (model.id, "up/m"):
                        body = ask(m, "hi")
                        headers = {"traceparent": TRACEPARENT}
                        async with s.post("/v1/chat/completions", json=body, headers=headers) as r:
                            assert r.status == 200
            assert server_telemetry.SCOPE not in app
        finally:
            await asyncio.to_thread(app[RECORDER].store.close)
            await h.close()
    assert seen == [None]  # nothing sent upstream either
    assert global_spans.get_finished_spans() == ()
    rows = read_records(db)
    assert len(rows) == 2 and all(r.trace_id is None for r in rows)


async def test_the_env_var_turns_on_otlp_export_flushed_when_the_server_stops(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    got: dict[str, list[bytes]] = {"/v1/traces": [], "/v1/metrics": []}

    async def receive(request: web.Request) -> web.Response:
        got[request.path].append(await request.read())
        return web.Response(body=b"", content_type="application/x-protobuf")

    collector = web.Application()
    collector.router.add_post("/v1/traces", receive)
    collector.router.add_post("/v1/metrics", receive)
    async with TestServer(collector, host="127.0.0.1") as otlp:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", str(otlp.make_url("")).rstrip("/"))
        monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
        monkeypatch.delenv("OTEL_RESOURCE_ATTRIBUTES", raising=False)
        lib = ModelLibrary(tmp_path / "lib.json", tmp_path / "models")
        lib.import_path(write_model(tmp_path / "src" / "tiny.gguf"))
        (model,) = lib.list()
        h = assemble(lib, {"gguf": FakeRuntime(delay=0.0)}, load_defaults=LoadOptions)
        app = create_app(h, ServerSettings())
        try:
            async with TestServer(app, host="127.0.0.1") as server:
                root = str(server.make_url("")).rstrip("/")
                async with aiohttp.ClientSession(root) as s:
                    async with s.post("/v1/chat/completions", json=ask(model.id, "hi")) as r:
                        assert r.status == 200
            # the server stopped: what the batch processor and the reader held went out
        finally:
            await h.close()
    assert got["/v1/traces"] and got["/v1/metrics"]
    names: set[str] = set()
    services: set[str] = set()
    for raw in got["/v1/traces"]:
        req = ExportTraceServiceRequest.FromString(raw)
        for rs in req.resource_spans:
            services |= {
                a.value.string_value for a in rs.resource.attributes if a.key == "service.name"
            }
            names |= {sp.name for ss in rs.scope_spans for sp in ss.spans}
    assert services == {"hearth"}
    assert {"POST /v1/chat/completions", "attempt", *PHASES} <= names
    metric_names = {
        m.name
        for raw in got["/v1/metrics"]
        for rm in ExportMetricsServiceRequest.FromString(raw).resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
    }
    assert {
        "hearth.server.requests",
        "hearth.server.request.duration",
        "hearth.server.time_to_first_token",
        "hearth.tokens",
    } <= metric_names
