"""The remote client against a hostile or broken engine (a small aiohttp app on loopback that
answers what each test scripts): long and over-long SSE lines, a model list sent in pieces, a
body over the bound, huge headers, malformed logprobs, an error that echoes the key. Nothing
raises out of the client but Hearth's own errors, nothing grows without bound, and no part of
the key survives."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web

from app.core.gateway.providers.store import ProviderConfig
from app.core.requests import ChatRequest, EmbeddingRequest
from app.core.types import ChatMessage
from app.errors import HearthError, ProviderError
from app.runtimes.remote import stream as stream_mod
from app.runtimes.remote.client import RemoteEngine
from tests.conftest import listen_loopback

KEY = "sk-canary-0f9e8d7c6b5a"
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@pytest.fixture
async def engine_at() -> AsyncIterator[Callable[[dict[str, Handler]], Awaitable[RemoteEngine]]]:
    runners: list[web.AppRunner] = []
    clients: list[RemoteEngine] = []

    async def start(routes: dict[str, Handler]) -> RemoteEngine:
        app = web.Application()
        for path, h in routes.items():
            app.router.add_route("*", path, h)
        runner, url = await listen_loopback(app)
        runners.append(runner)
        cfg = ProviderConfig("evil", f"{url}/v1", idle_timeout=5)
        c = RemoteEngine(cfg, KEY)
        clients.append(c)
        return c

    yield start
    for c in clients:
        await c.close()
    for r in runners:
        await r.cleanup()


def _chat() -> ChatRequest:
    return ChatRequest("evil/m", (ChatMessage("user", "hi"),))


async def _sse(request: web.Request, lines: list[bytes]) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for line in lines:
        await resp.write(line)
    await resp.write_eof()
    return resp


def _chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
    obj = {"choices": [{"index": 0, "delta": delta, "finish_reason": finish, **extra}]}
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


async def _collect(stream: Any) -> tuple[str, Any]:
    text, final = "", None
    async for d in stream:
        text += d.text
        if d.finish_reason is not None:
            final = d
    return text, final


async def test_a_long_line_passes_and_an_over_long_one_ends_with_an_error(
    engine_at: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(stream_mod, "MAX_LINE", 1024 * 1024)
    long_args = "x" * 300_000  # over aiohttp's own 128 KiB readline bound

    async def chat(request: web.Request) -> web.StreamResponse:
        call = {"index": 0, "id": "c", "type": "function",
                "function": {"name": "f", "arguments": long_args}}  # fmt: skip
        return await _sse(request, [
            _chunk({"content": "a"}),
            _chunk({"tool_calls": [call]}),
            b"data: " + b"y" * (2 * 1024 * 1024) + b"\n\n",  # over MAX_LINE: no end in sight
        ])  # fmt: skip

    c = await engine_at({"/v1/chat/completions": chat})
    stream = await c.chat("m", _chat())
    got = [d async for d in stream]
    args = "".join(tc.arguments for d in got for tc in d.tool_calls)
    assert args == long_args
    assert got[-1].finish_reason == "error" and "over 1 MiB" in (got[-1].error or "")


async def test_an_over_long_first_line_is_a_provider_error(
    engine_at: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(stream_mod, "MAX_LINE", 64 * 1024)

    async def chat(request: web.Request) -> web.StreamResponse:
        return await _sse(request, [b"data: " + b"y" * (200 * 1024) + b"\n\n"])

    c = await engine_at({"/v1/chat/completions": chat})
    with pytest.raises(ProviderError, match="over 0 MiB|stream line") as e:
        await c.chat("m", _chat())
    assert e.value.retryable


async def test_a_model_list_sent_in_pieces_is_read_whole(engine_at: Any) -> None:
    body = json.dumps({"object": "list", "data": [{"id": f"m{i}", "object": "model"}
                                                   for i in range(2000)]}).encode()  # fmt: skip

    async def models(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        await resp.write(body[: len(body) // 2])
        await asyncio.sleep(0.2)  # the second half comes later: read() returns the first alone
        await resp.write(body[len(body) // 2 :])
        await resp.write_eof()
        return resp

    c = await engine_at({"/v1/models": models})
    p = await c.probe()
    assert p.state == "ready" and len(p.models) == 1024  # kinds.MAX_MODELS: all it keeps


async def test_a_whole_answer_over_the_bound_is_refused(
    engine_at: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(stream_mod, "MAX_BODY", 256 * 1024)

    async def embeddings(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        for _ in range(64):  # 4 MiB, endless as far as the bound goes
            await resp.write(b" " * 65536)
        await resp.write_eof()
        return resp

    c = await engine_at({"/v1/embeddings": embeddings})
    with pytest.raises(ProviderError, match="a body under"):
        await c.embed("m", EmbeddingRequest("evil/m", ("a",)))


async def test_huge_headers_are_refused_not_buffered(engine_at: Any) -> None:
    async def models(request: web.Request) -> web.StreamResponse:
        return web.Response(text="{}", headers={f"X-Junk-{i}": "j" * 60_000 for i in range(4)})

    c = await engine_at({"/v1/models": models})
    p = await c.probe()
    assert p.state == "unreachable"  # aiohttp's own header bounds (8 KiB a line) refused it


async def test_malformed_logprobs_do_not_crash_the_stream(engine_at: Any) -> None:
    async def chat(request: web.Request) -> web.StreamResponse:
        bad = {"content": [{"token": "a", "logprob": None, "bytes": 5,
                            "top_logprobs": [{"token": "b", "logprob": "x"}, None]}]}  # fmt: skip
        return await _sse(request, [
            _chunk({"content": "a"}, logprobs=bad),
            _chunk({"content": "b"}, logprobs={"content": "nonsense"}),
            _chunk({}, "stop"),
            b"data: [DONE]\n\n",
        ])  # fmt: skip

    c = await engine_at({"/v1/chat/completions": chat})
    text, final = await _collect(await c.chat("m", _chat()))
    assert text == "ab" and final.finish_reason == "stop"


async def test_no_part_of_an_echoed_key_survives(engine_at: Any) -> None:
    """The key straddling the 300-character clip of an error message, in an answer, a probe
    and a stream's error event."""
    echo = "x" * 290 + f" invalid api key {KEY} provided"

    async def refuse(request: web.Request) -> web.StreamResponse:
        return web.json_response({"error": {"message": echo}}, status=401)

    async def chat(request: web.Request) -> web.StreamResponse:
        err = {"error": {"message": f"late failure for {KEY}", "code": 500}}
        return await _sse(request, [_chunk({"content": "a"}),
                                    b"data: " + json.dumps(err).encode() + b"\n\n"])  # fmt: skip

    c = await engine_at(
        {"/v1/models": refuse, "/v1/embeddings": refuse, "/v1/chat/completions": chat}
    )
    seen: list[str] = []
    p = await c.probe()
    seen.append(str(p.error))
    with pytest.raises(HearthError) as e:
        await c.embed("m", EmbeddingRequest("evil/m", ("a",)))
    seen.append(e.value.message)
    _, final = await _collect(await c.chat("m", _chat()))
    seen.append(str(final.error))
    for s in seen:
        for n in range(6, len(KEY) + 1):  # no 6-character prefix of the key, anywhere
            assert KEY[:n] not in s, s
    assert p.state == "unauthorized" and "***" in seen[2]
