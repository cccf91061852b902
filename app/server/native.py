"""Hearth's management API under /api/v1/: used by the CLI and scripts while a server runs."""

from __future__ import annotations

from aiohttp import web

from app.server.app import SERVICE, read_json_body
from app.server.schemas import Body

routes = web.RouteTableDef()


@routes.get("/api/v1/models")
async def models(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    return web.json_response({"models": [s.as_dict() for s in service.models()]})


@routes.get("/api/v1/ps")
async def ps(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    return web.json_response(
        {
            "models": [
                {
                    "id": i.model_id,
                    "runtime": i.runtime,
                    "context_length": i.context_length,
                    "loaded_at": i.loaded_at,
                    "last_used": i.last_used,
                    "pending_requests": i.pending,
                }
                for i in service.scheduler.loaded()
            ],
            "loading": service.scheduler.loading(),
        }
    )


@routes.post("/api/v1/models/load")
async def load(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    b = Body(await read_json_body(request))
    model_id = b.text("model", required=True) or ""
    lm = await service.load(model_id)
    return web.json_response(
        {"id": model_id, "state": "loaded", "context_length": lm.context_length}
    )


@routes.post("/api/v1/models/unload")
async def unload(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    b = Body(await read_json_body(request))
    model_id = b.text("model", required=True) or ""
    service.library.get(model_id)  # 404 for unknown ids
    was_loaded = await service.unload(model_id)
    return web.json_response({"id": model_id, "state": "not-loaded", "was_loaded": was_loaded})
