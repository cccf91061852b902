"""A remote engine's answer is bounded like a local one, through the real server: a stream
that ignores ``max_tokens`` ends there, one over the answer bound ends with a 502-class error
event, a too-deep or malformed data line answers 502 at once, and a redirect is not followed
(the prompt never reaches where it points) unless the provider allows it. The engine is a
small aiohttp app on 127.0.0.1 whose behaviour each model name picks."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from app.core.gateway.providers.pool import ProviderPool
from app.core.gateway.providers.store import ProviderConfig, ProviderStore
from app.core.library.index import ModelLibrary
from app.core.service import Hearth, assemble
from app.core.types import LoadOptions
from app.runtimes.remote import stream as stream_mod
from app.runtimes.remote.client import RemoteEngine
from app.server.app import create_app
from app.settings import ServerSettings
from tests.conftest import listen_loopback

MODELS = ("forever", "huge", "deep", "malformed", "redirect")
DEADLINE_S = 60.0  # liveness only: the old code ran these until a 120 s timeout or for ever


@dataclass
class Hostile:
    """What the engines saw: a stream's connection closed by Hearth, posts to the target."""

    closed: asyncio.Event = field(default_factory=asyncio.Event)
    redirected_posts: list[Any] = field(default_factory=list)
    target_url: str = ""
    release: asyncio.Event = field(default_factory=asyncio.Event)  # held streams end at teardown


def _chunk(text: str) -> bytes:
    obj = {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


async def _start(app: web.Application, runners: list[web.AppRunner]) -> str:
    runner, url = await listen_loopback(app)
    runners.append(runner)
    return str(url)


def _engine_app(seen: Hostile) -> web.Application:
    async def models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": m} for m in MODELS]})

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        model = body["model"]
        if model == "redirect":
            raise web.HTTPTemporaryRedirect(seen.target_url + "/v1/chat/completions")
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        try:
            if model == "deep":
                await resp.write(b"data: " + b"[" * 200_000 + b"\n\n")
            elif model == "malformed":
                await resp.write(b'data: {"choices": [{"delta": {"content": "a"\n\n')
            else:  # forever / huge: ignore max_tokens, stream until Hearth hangs up
                piece = "x" if model == "forever" else "y" * 8192
                while True:
                    await resp.write(_chunk(piece))
            await seen.release.wait()  # hold the connection open: no end to wait for
        except (ConnectionError, asyncio.CancelledError):
            seen.closed.set()
            raise
        return resp

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", chat)
    return app


def _target_app(seen: Hostile) -> web.Application:
    async def chat(request: web.Request) -> web.Response:
        seen.redirected_posts.append(await request.read())
        return web.json_response({"error": {"message": "should never be reached"}}, status=500)

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    return app


@dataclass
class Front:
    url: str
    seen: Hostile
    pool: ProviderPool
    service: Hearth


@pytest.fixture
async def front(tmp_path: Path) -> AsyncIterator[Front]:
    seen = Hostile()
    runners: list[web.AppRunner] = []
    seen.target_url = await _start(_target_app(seen), runners)
    engine_url = await _start(_engine_app(seen), runners)
    providers = ProviderStore(tmp_path / "providers.json", tmp_path / "provider_keys.json")
    lib = ModelLibrary(tmp_path / "lib.json", tmp_path / "models")
    pool = ProviderPool(providers, RemoteEngine)
    service = assemble(lib, {}, load_defaults=LoadOptions, providers=pool)
    service.routing.add_provider(ProviderConfig("evil", engine_url + "/v1", kind="vllm"), None)
    try:
        async with TestServer(create_app(service, ServerSettings()), host="127.0.0.1") as srv:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + DEADLINE_S
            while not all(service.routing.is_routable(f"evil/{m}") for m in MODELS):
                assert loop.time() < deadline, "the provider never became ready"
                await asyncio.sleep(0.02)
            yield Front(str(srv.make_url("")).rstrip("/"), seen, pool, service)
    finally:
        seen.release.set()
        await service.close()
        for r in runners:
            await r.cleanup()


async def _post(front: Front, body: dict[str, Any]) -> tuple[int, bytes]:
    async with aiohttp.ClientSession() as http:
        async with asyncio.timeout(DEADLINE_S):
            async with http.post(front.url + "/v1/chat/completions", json=body) as resp:
                return resp.status, await resp.read()


def _events(raw: bytes) -> list[Any]:
    out = []
    for line in raw.decode().splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            out.append(json.loads(line[6:]))
    return out


HI = [{"role": "user", "content": "hi"}]


async def test_a_stream_past_max_tokens_ends_there_and_the_engine_is_hung_up_on(
    front: Front,
) -> None:
    body = {"model": "evil/forever", "messages": HI, "max_tokens": 50, "stream": True}
    status, raw = await _post(front, body)
    assert status == 200
    evs = _events(raw)
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in evs if e.get("choices"))
    assert text == "x" * 50
    finishes = [e["choices"][0]["finish_reason"] for e in evs if e.get("choices")]
    assert finishes[-1] == "length"
    assert raw.rstrip().endswith(b"data: [DONE]")
    await asyncio.wait_for(front.seen.closed.wait(), DEADLINE_S)


async def test_a_stream_over_the_answer_bound_ends_with_a_provider_error_event(
    front: Front, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(stream_mod, "MAX_BODY", 256 * 1024)
    status, raw = await _post(front, {"model": "evil/huge", "messages": HI, "stream": True})
    assert status == 200
    last = _events(raw)[-1]
    assert last["error"]["code"] == "provider_error", last
    assert "answer bound" in last["error"]["message"]
    assert b"[DONE]" not in raw
    await asyncio.wait_for(front.seen.closed.wait(), DEADLINE_S)
    # the same answer asked whole: a 502, not the bytes
    status, raw = await _post(front, {"model": "evil/huge", "messages": HI})
    assert status == 502 and json.loads(raw)["error"]["code"] == "provider_error"


@pytest.mark.parametrize("model", ["deep", "malformed"])
async def test_a_bad_data_line_answers_502_at_once(front: Front, model: str) -> None:
    # the provider's first-token timeout is 120 s: answering at all within the deadline
    # shows the line was not skipped
    status, raw = await _post(front, {"model": f"evil/{model}", "messages": HI})
    err = json.loads(raw)["error"]
    assert status == 502, raw
    assert err["code"] == "provider_error"
    assert "malformed data line" in err["message"]


async def test_a_redirect_is_not_followed_unless_the_provider_allows_it(front: Front) -> None:
    body = {"model": "evil/redirect", "messages": HI, "max_tokens": 5}
    status, raw = await _post(front, body)
    err = json.loads(raw)["error"]
    assert status == 502, raw
    assert "redirect (307 to " + front.seen.target_url in err["message"]
    assert front.seen.redirected_posts == []  # the prompt went nowhere else
    # a provider configured to follow them does
    cfg = front.pool.store.get("evil")
    assert cfg is not None and not cfg.follow_redirects
    front.service.routing.add_provider(
        ProviderConfig(**{**cfg.as_json(), "follow_redirects": True}), None
    )
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEADLINE_S
    while not front.service.routing.is_routable("evil/redirect"):
        assert loop.time() < deadline, "the provider never became ready again"
        await asyncio.sleep(0.02)
    await _post(front, body)
    assert len(front.seen.redirected_posts) == 1
