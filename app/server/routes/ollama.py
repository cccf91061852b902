"""Ollama-shaped routes (/api/tags, /api/show, /api/chat, /api/generate, /api/embed,
/api/embeddings, /api/ps, /api/version) on the same port, for apps that only speak Ollama.
NDJSON streams; every error (401, 403, 413, 404, 400...) is ``{"error": "..."}``. Hearth's own
API lives under /api/v1/."""

from __future__ import annotations

import time
from typing import Any

from aiohttp import web

from app.core.requests import ChatRequest
from app.core.service import Hearth
from app.errors import InvalidRequest, ModelNotFound
from app.server.edge.body import large_json_response, read_json_body
from app.server.edge.vision import resolve_images
from app.server.protocols import OLLAMA
from app.server.protocols.base import Context
from app.server.protocols.common import Body
from app.server.protocols.ollama import models as listing
from app.server.protocols.ollama import parse, render
from app.server.routes import ProtocolRoutes
from app.server.state import REQUEST_LOG, SERVICE, context_of, scope_of, with_context
from app.server.streaming import respond

routes = ProtocolRoutes(OLLAMA)


def resolver(request: web.Request) -> parse.Resolve:
    """Ollama names carry a tag ("llama3:latest"); Hearth ids may not."""
    service, scope = request.app[SERVICE], scope_of(request)

    def resolve(name: str) -> str:
        if name.endswith(listing.LATEST) and service.routing.is_routable(name):
            # /api/tags lists a remote "lan/foo" as "lan/foo:latest": the name comes back so
            bare = name.removesuffix(listing.LATEST)
            if _remote_listed(service, bare, scope) and not _remote_listed(service, name, scope):
                return bare
        if not name or service.routing.is_routable(name):
            return name  # default_model, an alias, auto, a remote id: the gateway resolves them
        try:
            return service.models.status(name, scope).model.id
        except ModelNotFound:
            if name.endswith(listing.LATEST):
                bare = name.removesuffix(listing.LATEST)
                if service.routing.is_routable(bare):
                    return bare
                return service.models.status(bare, scope).model.id
            raise

    return resolve


def _remote_listed(service: Hearth, model_id: str, scope: tuple[str, ...] | None) -> bool:
    return any(r.id == model_id for r in service.routing.remote_models(scope))


async def _load_ns(request: web.Request, model_id: str) -> int:
    """Load ahead of the work (JIT, as any request would) to report Ollama's load_duration."""
    service = request.app[SERVICE]
    if service.routing.is_routable(model_id) or not model_id:
        return 0  # an alias or auto: the gateway picks (and loads) the target
    if service.models.status(model_id, scope_of(request)).state == "loaded":
        return 0
    t0 = time.perf_counter_ns()
    async with service.using(model_id, context_of(request)):
        pass
    return time.perf_counter_ns() - t0


@routes.get("/api/version")
async def version(request: web.Request) -> web.Response:
    return web.json_response(listing.version())


@routes.get("/api/tags")
async def tags(request: web.Request) -> web.Response:
    service, scope = request.app[SERVICE], scope_of(request)
    names: dict[str, Any] = dict(service.routing.aliases(scope))
    if (groups := service.routing.groups) is not None:  # listed as an alias is
        names.update(groups.visible(scope))
    return web.json_response(
        listing.tags(service.models.all(scope), names, service.routing.remote_models(scope))
    )


@routes.post("/api/show")
async def show(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    b = Body(await read_json_body(request))
    name = b.text("model") or b.text("name") or ""
    if not name:
        raise InvalidRequest("'model' is required", param="model")
    model_id = resolver(request)(name)
    scope = scope_of(request)
    remote = service.routing.remote_listing(model_id, scope)  # 503: provider down, 404 unlisted
    if remote is not None:
        return web.json_response(listing.show_remote(remote))
    local = service.resolve_local(model_id, scope)
    return web.json_response(listing.show(service.models.status(local, scope)))


@routes.get("/api/ps")
async def ps(request: web.Request) -> web.Response:
    service, scope = request.app[SERVICE], scope_of(request)
    return web.json_response(listing.ps(service.models.loaded(scope), service.models.all(scope)))


async def _generation(request: web.Request, parsed: parse.Parsed, ctx: Context) -> Any:
    """/api/chat and /api/generate after parsing: load/unload, or generate through the one
    streaming path (time limit, disconnect, errors as ``{"error": ...}`` lines)."""
    service: Hearth = request.app[SERVICE]
    request[REQUEST_LOG]["model"] = parsed.model
    req = parsed.request
    if req is None:  # Ollama's idiom: an empty prompt loads, with keep_alive 0 unloads
        if parsed.ttl == 0:
            await service.models.unload(parsed.model, scope_of(request))
        else:
            await service.models.load(parsed.model, ttl=parsed.ttl, scope=scope_of(request))
        return web.json_response(render.load_response(parsed.model, parsed.key, parsed.ttl == 0))
    req = await resolve_images(request, req)  # carries the context; no vision: 400, no load
    ctx.load_ns = await _load_ns(request, parsed.model)
    choices = await (service.chat(req) if isinstance(req, ChatRequest) else service.complete(req))
    ctx.model = choices.model  # the model that answered (an alias's target, auto's pick)
    return await respond(
        request,
        choices,
        stream=parsed.stream,
        model=choices.model,
        whole=lambda results: render.whole_response(parsed.key, parsed.think, results, ctx),
        renderer=lambda: render.NdjsonStream(parsed.key, parsed.think, ctx),
    )


@routes.post("/api/chat")
async def chat(request: web.Request) -> web.StreamResponse:
    ctx = Context("")  # the request's clock starts here (total_duration)
    body = await read_json_body(request)
    parsed = parse.parse_chat(body, resolver(request))
    return await _generation(request, parsed, ctx)


@routes.post("/api/generate")
async def generate(request: web.Request) -> web.StreamResponse:
    ctx = Context("")
    body = await read_json_body(request)
    parsed = parse.parse_generate(body, resolver(request))
    return await _generation(request, parsed, ctx)


@routes.post("/api/embed")
async def embed(request: web.Request) -> web.Response:
    ctx = Context("")
    service: Hearth = request.app[SERVICE]
    req = with_context(request, parse.parse_embed(await read_json_body(request), resolver(request)))
    request[REQUEST_LOG]["model"] = req.model
    ctx.load_ns = await _load_ns(request, req.model)
    result = await service.embed(req)
    request[REQUEST_LOG]["prompt_tokens"] = result.prompt_tokens
    # megabytes of JSON for a big batch: encoded off the event loop
    return await large_json_response(
        render.embed_response(result, result.model, ctx, time.perf_counter_ns()),
        headers={"x-hearth-model": result.model, "x-hearth-route": ",".join(result.route)},
    )


@routes.post("/api/embeddings")
async def embeddings_legacy(request: web.Request) -> web.Response:
    service: Hearth = request.app[SERVICE]
    req = parse.parse_embeddings_legacy(await read_json_body(request), resolver(request))
    req = with_context(request, req)
    result = await service.embed(req)
    return web.json_response({"embedding": result.vectors[0]})
