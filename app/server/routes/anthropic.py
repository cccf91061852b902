"""Anthropic Messages routes: POST /v1/messages (stream and not), /v1/messages/count_tokens.
Tested by tests/server/clients/test_clients.py and tests/server/clients/test_count_tokens.py."""

from __future__ import annotations

from aiohttp import web

from app.server.edge.body import read_json_body
from app.server.edge.vision import resolve_images
from app.server.protocols import ANTHROPIC
from app.server.protocols.anthropic import parse, render
from app.server.protocols.base import Context
from app.server.routes import ProtocolRoutes
from app.server.state import REQUEST_LOG, SERVICE, with_context
from app.server.streaming import respond

routes = ProtocolRoutes(ANTHROPIC)


@routes.post("/v1/messages")
async def messages(request: web.Request) -> web.StreamResponse:
    parsed = parse.parse_request(await read_json_body(request))
    req = parsed.request
    request[REQUEST_LOG]["model"] = req.model
    # everything that can fail (404, context overflow, queue full) fails here, before headers
    choices = await request.app[SERVICE].chat(await resolve_images(request, req))
    ctx = Context(choices.model)  # the model that answered (an alias's target, auto's pick)
    prompt_tokens = choices.first.prompt_tokens
    return await respond(
        request,
        choices,
        stream=parsed.stream,
        model=choices.model,
        whole=lambda results: render.message_response(req, results, ctx),
        renderer=lambda: render.MessageStream(req, ctx, prompt_tokens),
    )


@routes.post("/v1/messages/count_tokens")
async def count_tokens(request: web.Request) -> web.Response:
    req = parse.parse_request(await read_json_body(request), counting=True).request
    request[REQUEST_LOG]["model"] = req.model
    req = await resolve_images(request, req)
    count = await request.app[SERVICE].count_tokens(with_context(request, req))
    return web.json_response({"input_tokens": count})
