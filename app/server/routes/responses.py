"""OpenAI Responses route: POST /v1/responses (stateless; stream and not). Its errors have
OpenAI's shape, as openai-python reads them.
Tested by tests/server/clients/test_clients.py and
tests/server/clients/test_messages_responses.py."""

from __future__ import annotations

from aiohttp import web

from app.server.edge.body import read_json_body
from app.server.edge.vision import resolve_images
from app.server.protocols import OPENAI
from app.server.protocols.base import Context
from app.server.protocols.responses import parse, render
from app.server.routes import ProtocolRoutes
from app.server.state import REQUEST_LOG, SERVICE
from app.server.streaming import respond

routes = ProtocolRoutes(OPENAI)


@routes.post("/v1/responses")
async def responses(request: web.Request) -> web.StreamResponse:
    parsed = parse.parse_request(await read_json_body(request))
    req = parsed.request
    request[REQUEST_LOG]["model"] = req.model
    choices = await request.app[SERVICE].chat(await resolve_images(request, req))
    ctx = Context(choices.model)  # the model that answered (an alias's target, auto's pick)
    return await respond(
        request,
        choices,
        stream=parsed.stream,
        model=choices.model,
        whole=lambda results: render.response_body(parsed.echo, results, ctx),
        renderer=lambda: render.ResponseStream(parsed.echo, ctx),
    )
