"""OpenAI-compatible routes: /v1/models, /v1/chat/completions, /v1/completions,
/v1/embeddings, /v1/rerank, /health (the tokenizer routes: tokenizer.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from aiohttp import web

from app.core.gateway.providers.pool import RemoteListing
from app.core.inference.generation import Choices, Completion
from app.core.types import ModelStatus
from app.server.edge.body import large_json_response, read_json_body
from app.server.edge.vision import resolve_images
from app.server.protocols import OPENAI
from app.server.protocols.base import Context, StreamRenderer
from app.server.protocols.openai import parse, render
from app.server.protocols.openai import rerank as rerank_wire
from app.server.protocols.openai.fields import StreamOptions
from app.server.routes import ProtocolRoutes
from app.server.routes.health import health_body, model_filter
from app.server.state import REQUEST_LOG, SERVICE, STATE, scope_of, with_context
from app.server.streaming import respond

routes = ProtocolRoutes(OPENAI)


def model_object(st: ModelStatus) -> dict[str, object]:
    m = st.model
    return {
        "id": m.id,
        "object": "model",
        "created": int(m.added_at),
        "owned_by": "hearth",
        "state": st.state,
        "format": m.format,
        "runtime": st.runtime,
        "architecture": m.architecture,
        "quantization": m.quantization,
        "context_length": st.context_length or m.context_length,
        "max_context_length": m.context_length,
        "size_bytes": m.size_bytes,
        "memory_bytes": st.memory_bytes,
        "capabilities": list(m.capabilities),
    }


@routes.get("/health")
async def health(request: web.Request) -> web.Response:
    # state: starting | ready | busy | error | ...
    body, status = health_body(request.app, model_filter(request))
    return web.json_response(body, status=status)


@routes.get("/v1/models")
async def list_models(request: web.Request) -> web.Response:
    service, scope = request.app[SERVICE], scope_of(request)
    data = [model_object(s) for s in service.models.all(scope)]
    data += [remote_object(r) for r in service.routing.remote_models(scope)]
    data += [alias_object(a, ts) for a, ts in service.routing.aliases(scope).items()]
    if (groups := service.routing.groups) is not None:
        visible = groups.visible(scope)
        data += [alias_object(g, ts, owner="group") for g, ts in visible.items()]
    return web.json_response({"object": "list", "data": data})


def remote_object(r: RemoteListing) -> dict[str, object]:
    """A provider's model: ``PREFIX + remote id``, owned by the provider."""
    return {
        "id": r.id,
        "object": "model",
        "created": 0,
        "owned_by": r.provider,
        "state": "remote",
        "context_length": r.model.context_length,
        "capabilities": list(r.model.capabilities),
    }


def alias_object(alias: str, targets: Sequence[str], owner: str = "alias") -> dict[str, object]:
    """An alias in /v1/models: a name standing for its targets (a fallback chain, in order);
    a replica group (``owner`` "group") stands for its members the same way."""
    return {
        "id": alias,
        "object": "model",
        "created": 0,
        "owned_by": owner,
        "targets": list(targets),
    }


@routes.get("/v1/models/{model_id:.+}")
async def get_model(request: web.Request) -> web.Response:
    service, scope = request.app[SERVICE], scope_of(request)
    model_id = request.match_info["model_id"]
    remote = service.routing.remote_listing(model_id, scope)  # 503: provider down, 404 unlisted
    if remote is not None:
        return web.json_response(remote_object(remote))
    targets = service.routing.alias(model_id, scope)
    if targets is not None:
        return web.json_response(alias_object(model_id, targets))
    groups = service.routing.groups
    if groups is not None and (members := groups.visible(scope).get(model_id)):
        return web.json_response(alias_object(model_id, members, owner="group"))
    return web.json_response(model_object(service.models.status(model_id, scope)))


async def _generate(
    request: web.Request,
    parsed: parse.Parsed,
    start: Callable[[Any], Awaitable[Choices]],
    whole: Callable[[Any, Sequence[Completion], Context], dict[str, Any]],
    stream: Callable[[Any, StreamOptions, Context], StreamRenderer],
) -> web.StreamResponse:
    """Start the request's generations (everything that can fail — 404, context overflow,
    queue full — fails here, before headers) and answer through the one streaming path."""
    req = parsed.request
    request[REQUEST_LOG]["model"] = req.model
    choices = await start(await resolve_images(request, req))
    # the model that answered (an alias's target, auto's pick): what the response names
    ctx = Context(choices.model, reasoning_also=request.app[STATE].settings.reasoning_field_also)
    return await respond(
        request,
        choices,
        stream=parsed.stream.stream,
        model=choices.model,
        whole=lambda results: whole(req, results, ctx),
        renderer=lambda: stream(req, parsed.stream, ctx),
    )


@routes.post("/v1/chat/completions")
async def chat_completions(request: web.Request) -> web.StreamResponse:
    parsed = parse.parse_chat(await read_json_body(request))
    service = request.app[SERVICE]
    return await _generate(request, parsed, service.chat, render.chat_response, render.ChatStream)


@routes.post("/v1/completions")
async def completions(request: web.Request) -> web.StreamResponse:
    parsed = parse.parse_completion(await read_json_body(request))
    service = request.app[SERVICE]
    return await _generate(
        request, parsed, service.complete, render.completion_response, render.CompletionStream
    )


@routes.post("/v1/embeddings")
async def embeddings(request: web.Request) -> web.Response:
    req, fmt = parse.parse_embeddings(await read_json_body(request))
    req = with_context(request, req)
    request[REQUEST_LOG]["model"] = req.model
    result = await request.app[SERVICE].embed(req)
    request[REQUEST_LOG]["prompt_tokens"] = result.prompt_tokens
    request[REQUEST_LOG]["answered_by"] = result.model
    # ~1 s for 2,048 vectors: built and encoded off the event loop
    body = await asyncio.to_thread(render.embeddings_response, req, result, fmt, result.model)
    return await large_json_response(body, headers=_route_headers(result.model, result.route))


def _route_headers(model: str, route: Sequence[str]) -> dict[str, str]:
    return {"x-hearth-model": model, "x-hearth-route": ",".join(route or [model])}


@routes.post("/v1/rerank")
@routes.post("/rerank")
async def rerank(request: web.Request) -> web.Response:
    parsed = rerank_wire.parse_request(await read_json_body(request))
    request[REQUEST_LOG]["model"] = parsed.request.model
    result = await request.app[SERVICE].rerank(with_context(request, parsed.request))
    request[REQUEST_LOG]["prompt_tokens"] = result.prompt_tokens
    return web.json_response(rerank_wire.rerank_response(parsed, result))
