"""llama-server's fill-in-the-middle route, POST /infill (llama.vscode, llama.vim, Twinny):
the body made a FIM completion request, served through the pipeline every route shares, and
answered in llama-server's shape, whole or as SSE events.
Tested by tests/server/fim/test_fim_wire.py."""

from __future__ import annotations

from aiohttp import web

from app.server.edge.body import read_json_body
from app.server.protocols import OPENAI
from app.server.protocols.base import Context
from app.server.protocols.llama import parse, render
from app.server.routes import ProtocolRoutes
from app.server.state import REQUEST_LOG, SERVICE, with_context
from app.server.streaming import respond

# its errors in OpenAI's shape: llama-server's own is the same object with a numeric code
routes = ProtocolRoutes(OPENAI)


@routes.post("/infill")
async def infill(request: web.Request) -> web.StreamResponse:
    parsed = parse.parse_infill(await read_json_body(request))
    req = with_context(request, parsed.request)
    request[REQUEST_LOG]["model"] = req.model
    choices = await request.app[SERVICE].complete(req)
    ctx = Context(choices.model)
    prompt_tokens = choices.first.prompt_tokens
    return await respond(
        request,
        choices,
        stream=parsed.stream,
        model=choices.model,
        whole=lambda results: render.infill_response(req, results[0], ctx),
        renderer=lambda: render.InfillStream(req, ctx, prompt_tokens),
    )
