"""GET /api/v1/metrics (JSON) and GET /metrics (Prometheus text): the numbers add
up, the labels stay bounded and no prompt text, unknown model name or raw path gets in.

The real aiohttp app on a loopback port over the real Worker (a scripted engine for speed).
"""

from __future__ import annotations

import contextlib
import json
import time
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from prometheus_client.parser import text_string_to_metric_families

from app.core.library.index import ModelLibrary
from app.core.service import assemble
from app.core.types import LoadOptions
from app.server.app import create_app
from app.server.routes import metrics as server_metrics
from app.settings import ServerSettings, hash_key
from tests.conftest import Served
from tests.server.telemetry.traffic import CANARY, ask, mixed
from tests.support.fakes import FakeRuntime
from tests.support.gguf_files import write_model

KEY = "sk-metrics-test"
AUTH = {"Authorization": f"Bearer {KEY}"}


@contextlib.asynccontextmanager
async def fake_app(
    tmp_path: Path, *, api_key: str | None = None
) -> AsyncIterator[tuple[aiohttp.ClientSession, str, web.Application]]:
    lib = ModelLibrary(tmp_path / "lib.json", tmp_path / "models")
    lib.import_path(write_model(tmp_path / "src" / "tiny.gguf"))
    (model,) = lib.list()
    h = assemble(lib, {"gguf": FakeRuntime(delay=0.0)}, load_defaults=LoadOptions)
    hashes = (hash_key(api_key),) if api_key else ()
    app = create_app(h, ServerSettings(), api_key_hashes=hashes)
    try:
        async with TestServer(app, host="127.0.0.1") as server:
            root = str(server.make_url("")).rstrip("/")
            async with aiohttp.ClientSession(root, headers=AUTH if api_key else None) as s:
                yield s, model.id, app
    finally:
        await h.close()


async def test_json_metrics_add_up_per_model(tmp_path: Path) -> None:
    async with fake_app(tmp_path) as (s, model, _app):
        usage = []
        for stream in (False, True):
            body = ask(model, "hi", stream=stream, stream_options={"include_usage": True})
            async with s.post("/v1/chat/completions", json=body) as r:
                assert r.status == 200
                if stream:
                    text = await r.text()
                    last = [ln for ln in text.splitlines() if '"usage":{' in ln][-1]
                    usage.append(json.loads(last[6:])["usage"])
                else:
                    usage.append((await r.json())["usage"])
        async with s.post("/v1/chat/completions", json=ask("nobody/unknown", "hi")) as r:
            assert r.status == 404
        async with s.get("/v1/models") as r:
            assert r.status == 200
        for _ in range(3):  # polling is not traffic
            async with s.get("/health") as r:
                assert r.status == 200
        async with s.get("/api/v1/metrics") as r:
            assert r.status == 200
            m = await r.json()
    tin = sum(u["prompt_tokens"] for u in usage)
    tout = sum(u["completion_tokens"] for u in usage)
    assert tin > 0 and tout > 0
    assert set(m) == {
        "uptime_s",
        "requests",
        "tokens",
        "tokens_per_second",
        "ttft_ms",
        "models",
    }
    assert m["uptime_s"] > 0
    assert m["requests"] == {"total": 4, "ok": 3, "failed": 1}
    assert m["tokens"] == {"in": tin, "out": tout}
    assert set(m["models"]) == {model, "other"}  # the unknown name is counted, not named
    mine = m["models"][model]
    assert mine["requests"] == {"total": 2, "ok": 2, "failed": 0}
    assert mine["tokens"] == {"in": tin, "out": tout}
    assert mine["tokens_per_second"] is not None and mine["tokens_per_second"] > 0
    assert 0 < mine["ttft_ms"]["p50"] <= mine["ttft_ms"]["p95"]
    assert m["ttft_ms"] == mine["ttft_ms"]
    other = m["models"]["other"]
    assert other["requests"] == {"total": 1, "ok": 0, "failed": 1}
    assert other["ttft_ms"] == {"p50": None, "p95": None} and other["tokens_per_second"] is None


async def test_prometheus_labels_bounded_no_canary_behind_key(tmp_path: Path) -> None:
    async with fake_app(tmp_path, api_key=KEY) as (s, model, app):
        async with aiohttp.ClientSession(str(s._base_url)) as anonymous:
            async with anonymous.get("/metrics") as r:
                assert r.status == 401  # behind the key when one is set
        statuses: dict[str, int] = {}
        made_up: set[str] = set()
        for i in range(300):
            await mixed(s, model, i, made_up)
        async with s.get("/metrics") as r:
            assert r.status == 200
            assert r.headers["Content-Type"].startswith("text/plain")
            text = await r.text()
        async with s.get("/api/v1/metrics") as r:
            as_json = await r.text()
        patterns = {res.canonical for res in app.router.resources()}
    assert CANARY not in text and CANARY not in as_json
    assert not [n for n in made_up if n in text or n in as_json]
    families = {f.name: f for f in text_string_to_metric_families(text)}
    samples = [x for f in families.values() for x in f.samples]
    routes_seen = {x.labels["route"] for x in samples if "route" in x.labels}
    models_seen = {x.labels["model"] for x in samples if "model" in x.labels}
    assert routes_seen <= patterns | {"unmatched"}
    assert {"unmatched", "/v1/chat/completions", "/v1/models/{model_id}"} <= routes_seen
    assert models_seen <= {model, "other", "none"} and {model, "other"} <= models_seen
    for x in families["hearth_requests"].samples:
        if x.name == "hearth_requests_total":
            statuses[x.labels["status_class"]] = statuses.get(x.labels["status_class"], 0) + int(
                x.value
            )
    assert sum(statuses.values()) >= 300 and statuses["2xx"] > 0 and statuses["4xx"] > 0
    # the documented bound, from the label sets: R routes (+unmatched), 5 status classes,
    # M models (library + other + none), and each histogram's buckets (+Inf)
    r, sc, m = len(patterns) + 1, 5, 1 + 2
    d = len(server_metrics.DURATION_BUCKETS) + 1
    t = len(server_metrics.TTFT_BUCKETS) + 1
    bound = 2 * r * sc * m + (d + 3) * r + (t + 3) * m + 4 * m + 2 + 5
    assert bound == server_metrics.series_bound(len(patterns), 1)
    assert 0 < len(samples) < bound
    # the scrape's numbers are real: the chat tokens counted under the model's own label
    tokens = {
        (x.labels["model"], x.labels["direction"]): x.value
        for x in families["hearth_tokens"].samples
        if x.name == "hearth_tokens_total"
    }
    assert tokens[(model, "in")] > 0 and tokens[(model, "out")] > 0
    states = {x.labels["state"]: x.value for x in families["hearth_health_state"].samples}
    assert states == {"starting": 0, "ready": 1, "busy": 0, "error": 0, "shutting_down": 0}


@pytest.mark.model
def test_real_model_ttft_is_within_what_the_client_saw(served: Served) -> None:
    """SmolLM2 on the real server: the TTFT in both endpoints is positive and no later than the
    first content chunk reached the client."""
    import openai

    client = openai.OpenAI(base_url=served.base_url, api_key="x", max_retries=0, timeout=120)
    t0 = time.monotonic()
    first: float | None = None
    text = ""
    stream = client.chat.completions.create(
        model=served.model_id,
        messages=[{"role": "user", "content": "Name a colour."}],
        max_tokens=8,
        temperature=0,
        stream=True,
    )
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            first = first or time.monotonic()
            text += chunk.choices[0].delta.content
    assert first is not None and text
    seen_ms = (first - t0) * 1000.0
    with urllib.request.urlopen(served.root + "/api/v1/metrics", timeout=30) as r:
        mine = json.loads(r.read())["models"][served.model_id]
    assert 0 < mine["ttft_ms"]["p50"] <= seen_ms
    assert mine["tokens"]["out"] > 0 and mine["tokens_per_second"] > 0
    with urllib.request.urlopen(served.root + "/metrics", timeout=30) as r:
        families = {f.name: f for f in text_string_to_metric_families(r.read().decode())}
    (count,) = [
        x.value
        for x in families["hearth_time_to_first_token_seconds"].samples
        if x.name.endswith("_count") and x.labels["model"] == served.model_id
    ]
    assert count >= 1
