"""The response cache end to end on SmolLM2 and the shared MiniLM embedder: an
exact repeat is answered with the model unloaded (no load, no generation) and streams the same
frames; the request records say miss / hit; ``hearth cache stats --json`` and ``hearth cache
clear`` work on the file while the server runs, which misses after the clear; semantic mode hits
a paraphrase, misses an unrelated question and a request that differs in a sampling field."""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.cli import main
from app.core.gateway.cache.store import CacheConfig
from app.settings import SettingsStore
from tests.conftest import Served, serving
from tests.support.records import records_since

pytestmark = pytest.mark.model

DEADLINE = 120.0
ASK = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def srv(
    tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path, embedding_gguf: Path
) -> Iterator[Served]:
    with serving(tmp_path_factory.mktemp("cache"), smollm2_path, embedding_gguf) as s:
        yield s


def set_cache(s: Served, **cfg: Any) -> None:
    store = SettingsStore(s.home / "config" / "settings.json")
    store.update(cache=CacheConfig(**cfg))
    assert main(["cache", "clear"]) == 0


def post(s: Served, path: str, body: dict[str, Any]) -> tuple[str | None, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", int(s.port), timeout=DEADLINE)
    conn.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    raw = r.read()
    assert r.status == 200, raw
    return r.getheader("x-hearth-cache"), raw


def chat(s: Served, messages: list[dict[str, str]], **kw: Any) -> tuple[str | None, bytes]:
    body = {"model": s.model_id, "messages": messages, "temperature": 0, "max_tokens": 24, **kw}
    return post(s, "/v1/chat/completions", body)


def sse(raw: bytes) -> list[Any]:
    out = []
    for line in raw.decode().splitlines():
        if line.startswith("data: "):
            data = line[6:]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def scrub(frames: list[Any]) -> list[Any]:
    out = []
    for f in frames:
        if isinstance(f, dict):
            f = {k: v for k, v in f.items() if k not in ("id", "created", "timings")}
            if f.get("usage"):
                f["usage"] = {k: v for k, v in f["usage"].items() if k != "prompt_tokens_details"}
        out.append(f)
    return out


def cache_rows(s: Served, since: float, n: int) -> list[str | None]:
    """The ``cache`` of the ``n`` records of requests since ``since``, oldest first."""
    rows = records_since(s.home / "data" / "requests.sqlite", since, n)
    assert len(rows) == n, rows
    return [r.cache for r in reversed(rows)]


def stats(capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    capsys.readouterr()
    assert main(["cache", "stats", "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_an_exact_repeat_is_replayed_with_the_model_unloaded(
    srv: Served, capsys: pytest.CaptureFixture[str]
) -> None:
    set_cache(srv, mode="exact")
    t0 = time.time()
    opts = {"stream": True, "stream_options": {"include_usage": True}}
    first = chat(srv, ASK, **opts)
    assert first[0] == "miss"
    srv.call(srv.service.models.unload(srv.model_id))  # type: ignore[attr-defined]
    second = chat(srv, ASK, **opts)
    assert second[0] == "hit"
    # nothing loaded the model again: the runtime was not touched
    assert srv.service.models._scheduler.state(srv.model_id) == "not-loaded"  # type: ignore[attr-defined]
    f1, f2 = sse(first[1]), sse(second[1])
    assert scrub(f2) == scrub(f1)
    text = "".join(
        c["choices"][0]["delta"].get("content") or "" for c in f1 if c != "[DONE]" and c["choices"]
    )
    assert text.strip()
    usage = f2[-2]["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] == usage["prompt_tokens"] > 0
    assert cache_rows(srv, t0, 2) == ["miss", "hit"]  # the request records' cache field
    got = stats(capsys)
    assert set(got) == {
        "mode", "entries", "max_entries", "ttl_s", "hits", "semantic_hits", "misses",
        "bypasses", "bytes",
    }  # fmt: skip
    assert (got["mode"], got["entries"], got["hits"], got["misses"]) == ("exact", 1, 1, 1)
    assert got["bytes"] > 0


def test_the_running_server_misses_after_a_cli_clear(
    srv: Served, capsys: pytest.CaptureFixture[str]
) -> None:
    set_cache(srv, mode="exact")
    assert chat(srv, ASK)[0] == "miss"
    assert chat(srv, ASK)[0] == "hit"
    capsys.readouterr()
    assert main(["cache", "clear"]) == 0
    assert "cleared 1 cached response" in capsys.readouterr().out
    assert stats(capsys)["entries"] == 0
    assert chat(srv, ASK)[0] == "miss"
    assert chat(srv, ASK)[0] == "hit"


def test_a_sampled_request_is_bypassed(srv: Served) -> None:
    set_cache(srv, mode="exact")
    t0 = time.time()
    for _ in range(2):
        assert chat(srv, ASK, temperature=0.9)[0] == "bypass"
    assert cache_rows(srv, t0, 2) == ["bypass", "bypass"]


def test_semantic_mode_hits_a_paraphrase_on_minilm(
    srv: Served, capsys: pytest.CaptureFixture[str]
) -> None:
    embedder = "all-minilm-l6-v2-q8_0"
    srv.service.models.get(embedder)  # type: ignore[attr-defined]  # imported by the fixture
    set_cache(srv, mode="semantic", embedding_model=embedder)
    t0 = time.time()
    first = chat(srv, ASK)
    assert first[0] == "miss"
    # MiniLM puts these at cosine 0.99: over the default threshold of 0.9
    near = chat(srv, [{"role": "user", "content": "What's the capital of France?"}])
    assert near[0] == "semantic"
    assert json.loads(near[1])["choices"] == json.loads(first[1])["choices"]
    # ... and these at 0.13 and 0.68: under it
    assert chat(srv, [{"role": "user", "content": "How do I bake sourdough bread?"}])[0] == "miss"
    assert chat(srv, [{"role": "user", "content": "What is the capital of Spain?"}])[0] == "miss"
    # identical in everything else, or no hit: a sampling field differs here
    assert (
        chat(srv, [{"role": "user", "content": "What's the capital of France?"}], top_k=3)[0]
        == "miss"
    )
    assert cache_rows(srv, t0, 5) == ["miss", "semantic", "miss", "miss", "miss"]
    assert stats(capsys)["semantic_hits"] == 1
