"""OpenAI Responses routes: POST /v1/responses (stream and not; kept when ``store`` is on, and
continued by ``previous_response_id``), GET /v1/responses/{id}, GET
/v1/responses/{id}/input_items and DELETE /v1/responses/{id}. A stored response is the
caller's key's alone. Errors have OpenAI's shape, as openai-python reads them.
Tested by tests/server/clients/test_clients.py,
tests/server/clients/test_messages_responses.py and
tests/server/clients/test_stored_responses.py."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from app.core.gateway.response_store import StoredResponse
from app.server.edge.body import read_json_body
from app.server.edge.vision import resolve_images
from app.server.protocols import OPENAI
from app.server.protocols.base import Context
from app.server.protocols.responses import parse, render, stored
from app.server.routes import ProtocolRoutes
from app.server.state import REQUEST_LOG, SERVICE, context_of
from app.server.streaming import respond

routes = ProtocolRoutes(OPENAI)


@routes.post("/v1/responses")
async def responses(request: web.Request) -> web.StreamResponse:
    body = await read_json_body(request)
    store = request.app[SERVICE].responses
    partition = context_of(request).partition
    history = stored.history(store, partition, body)  # previous_response_id's conversation
    parsed = parse.parse_request(body, history)
    req = parsed.request
    request[REQUEST_LOG]["model"] = req.model
    choices = await request.app[SERVICE].chat(await resolve_images(request, req))
    ctx = Context(choices.model)  # the model that answered (an alias's target, auto's pick)

    def keep(response: dict[str, Any]) -> dict[str, Any]:
        if store is not None and parsed.echo.store:
            store.put(partition, stored.entry(response, history, parsed.items))
        return response

    return await respond(
        request,
        choices,
        stream=parsed.stream,
        model=choices.model,
        whole=lambda results: keep(render.response_body(parsed.echo, results, ctx)),
        renderer=lambda: render.ResponseStream(parsed.echo, ctx, on_done=keep),
    )


def _stored(request: web.Request) -> StoredResponse:
    rid = request.match_info["response_id"]
    return stored.find(request.app[SERVICE].responses, context_of(request).partition, rid)


@routes.get("/v1/responses/{response_id}")
async def get_response(request: web.Request) -> web.Response:
    stored.reject_stream(dict(request.query))
    return web.json_response(_stored(request).response)


@routes.get("/v1/responses/{response_id}/input_items")
async def input_items(request: web.Request) -> web.Response:
    return web.json_response(stored.input_items_page(_stored(request), dict(request.query)))


@routes.delete("/v1/responses/{response_id}")
async def delete_response(request: web.Request) -> web.Response:
    rid = request.match_info["response_id"]
    store = request.app[SERVICE].responses
    if store is None or not store.delete(context_of(request).partition, rid):
        raise stored.not_found(rid)
    return web.json_response(stored.deleted(rid))
