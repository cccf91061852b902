"""The response cache through the real server on the fake runtime: in every
protocol, a repeat is answered without the runtime and its stream (or body) is the first one's,
frame for frame (ids, timestamps and durations aside), with ``x-hearth-cache`` saying miss, then
hit, and the usage of the hit reporting the prompt's tokens as cached."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from app.core.gateway.cache.replay import ResponseCache
from app.core.gateway.cache.store import CacheConfig, CacheStore
from app.core.library.index import ModelLibrary
from app.core.service import assemble
from app.core.types import LoadOptions
from app.server.app import create_app
from app.settings import ServerSettings
from tests.support.fakes import FakeRuntime
from tests.support.gguf_files import CHATML, write_model

THINK = CHATML + "{% if add_generation_prompt %}{{ '<think>\\n' }}{% endif %}"
PIECES = ["Two", " and two.", "</think>", "\n\nIt is", " 4."]
ASK = [{"role": "user", "content": "2+2?"}]
# what differs between two answers by nature: ids, clocks, durations and speeds
VOLATILE = {"id", "created", "created_at", "system_fingerprint", "timings", "item_id"}
VOLATILE_SUFFIXES = ("_duration",)


@contextlib.asynccontextmanager
async def cached_server(tmp_path: Path) -> AsyncIterator[tuple[str, str, FakeRuntime]]:
    lib = ModelLibrary(tmp_path / "lib.json", tmp_path / "models")
    lib.import_path(write_model(tmp_path / "src" / "think.gguf", chat_template=THINK))
    (model,) = lib.list()
    runtime = FakeRuntime(delay=0.0, pieces=PIECES)
    store = CacheStore(tmp_path / "data" / "response_cache.sqlite")
    h = assemble(
        lib,
        {"gguf": runtime},
        load_defaults=LoadOptions,
        cache=lambda embed: ResponseCache(store, lambda: CacheConfig(mode="exact"), embed=embed),
    )
    app = create_app(h, ServerSettings())
    try:
        async with TestServer(app, host="127.0.0.1") as server:
            yield str(server.make_url("")).rstrip("/"), model.id, runtime
    finally:
        await h.close()


def _scrub(v: Any) -> Any:
    if isinstance(v, dict):
        return {
            k: _scrub(x)
            for k, x in v.items()
            if k not in VOLATILE and not k.endswith(VOLATILE_SUFFIXES)
        }
    if isinstance(v, list):
        return [_scrub(x) for x in v]
    return v


def _uncached(v: Any) -> Any:
    """The frames with the usage's cached token counts zeroed (the hit reports its own)."""
    if isinstance(v, dict):
        return {k: 0 if k == "cached_tokens" else _uncached(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_uncached(x) for x in v]
    return v


def _frames(raw: bytes, kind: str) -> list[Any]:
    text = raw.decode()
    if kind == "ndjson":
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    out: list[Any] = []
    for block in text.split("\n\n"):
        for line in block.splitlines():
            if line.startswith("event: "):
                out.append({"event": line[7:]})
            elif line.startswith("data: "):
                data = line[6:]
                out.append(data if data == "[DONE]" else json.loads(data))
    return out


def _cached_counts(v: Any) -> list[int]:
    if isinstance(v, dict):
        own = [v["cached_tokens"]] if isinstance(v.get("cached_tokens"), int) else []
        return own + [n for x in v.values() for n in _cached_counts(x)]
    if isinstance(v, list):
        return [n for x in v for n in _cached_counts(x)]
    return []


CASES = [
    ("/v1/chat/completions", {"messages": ASK, "stream_options": {"include_usage": True}}, "sse"),
    ("/v1/completions", {"prompt": "Once upon a time", "stream_options": {"include_usage": True}}, "sse"),
    ("/v1/responses", {"input": "2+2?"}, "sse"),
    ("/v1/messages", {"messages": ASK, "max_tokens": 64}, "sse"),
    ("/api/chat", {"messages": ASK}, "ndjson"),
    ("/api/generate", {"prompt": "Once upon a time"}, "ndjson"),
]  # fmt: skip


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
@pytest.mark.parametrize(("path", "body", "kind"), CASES, ids=[c[0] for c in CASES])
async def test_a_repeat_replays_the_same_protocol_sequence(
    tmp_path: Path, path: str, body: dict[str, Any], kind: str, stream: bool
) -> None:
    async with cached_server(tmp_path) as (root, model, runtime), aiohttp.ClientSession() as s:
        options = {"options": {"temperature": 0}} if path.startswith("/api/") else {}
        req = {"model": model, "stream": stream, "temperature": 0, **body, **options}
        if path.startswith("/api/"):
            req.pop("temperature")
        if not stream:
            req.pop("stream_options", None)
        answers = []
        for _ in range(2):
            async with s.post(root + path, json=req) as r:
                assert r.status == 200, await r.text()
                raw = await r.read()
                answers.append((r.headers.get("x-hearth-cache"), raw))
        assert [a[0] for a in answers] == ["miss", "hit"]
        assert sum(m.submit_calls for m in runtime.models) == 1  # the runtime saw one
        if stream:
            first, second = (_frames(a[1], kind) for a in answers)
        else:
            first, second = (json.loads(a[1]) for a in answers)
        assert _uncached(_scrub(second)) == _uncached(_scrub(first))
        assert len(str(second)) > 100  # frames, not an empty body
        counts = _cached_counts(second)
        if counts:  # the protocols that report cached tokens: all of the prompt on a hit
            assert max(counts) > 0


async def test_the_header_says_bypass_for_a_sampled_request(tmp_path: Path) -> None:
    async with cached_server(tmp_path) as (root, model, runtime), aiohttp.ClientSession() as s:
        req = {"model": model, "messages": ASK, "temperature": 0.7}
        for expected in ("bypass", "bypass"):
            async with s.post(root + "/v1/chat/completions", json=req) as r:
                assert r.status == 200 and r.headers["x-hearth-cache"] == expected
        forced = {"x-hearth-cache": "force"}
        for expected in ("miss", "hit"):
            async with s.post(root + "/v1/chat/completions", json=req, headers=forced) as r:
                assert r.status == 200 and r.headers["x-hearth-cache"] == expected
        assert sum(m.submit_calls for m in runtime.models) == 3
