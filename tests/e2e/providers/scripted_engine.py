"""A small OpenAI-compatible engine on a loop of the test's own, scripted per test: it answers
/health and /v1/models, and a chat either with a short stream or with the status and headers a
test sets (a 429 with ``Retry-After``), keeping each chat's headers and body."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

MODEL = "tiny"


@dataclass
class Script:
    status: int = 200  # what a chat answers; 200: a short stream
    headers: dict[str, str] = field(default_factory=dict)
    seen: list[tuple[dict[str, str], Any]] = field(default_factory=list)  # (headers, body)


def _chunk(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def engine_app(script: Script) -> web.Application:
    async def health(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def models(_: web.Request) -> web.Response:
        return web.json_response(
            {"object": "list", "data": [{"id": m, "object": "model"} for m in (MODEL, "g")]}
        )

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        script.seen.append(({k.lower(): v for k, v in request.headers.items()}, body))
        if script.status != 200:
            return web.json_response(
                {"error": {"message": "busy, come back later"}},
                status=script.status,
                headers=script.headers,
            )
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        delta = {"role": "assistant", "content": "hi"}
        await resp.write(_chunk({"choices": [{"index": 0, "delta": delta}]}))
        usage = {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}
        done = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], "usage": usage}
        await resp.write(_chunk(done))
        await resp.write(b"data: [DONE]\n\n")
        return resp

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", chat)
    return app
