"""Hearth's management API under /api/v1/: used by the CLI and scripts while a server runs."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from aiohttp import web

from app.core.engine.presets import validate_options
from app.core.engine.scheduler import LoadedInfo, parse_keep_alive
from app.errors import InvalidRequest
from app.server.edge.body import read_json_body
from app.server.protocols.common import Body, parse_ttl
from app.server.state import SERVICE, scope_of

routes = web.RouteTableDef()


def loaded_json(i: LoadedInfo) -> dict[str, Any]:
    return {
        "id": i.model_id,
        "runtime": i.runtime,
        "context_length": i.context_length,
        "cache_tokens": i.cache_tokens,
        "parallel": i.parallel,
        "loaded_at": i.loaded_at,
        "last_used": i.last_used,
        "pending_requests": i.pending,
        "memory_bytes": i.memory_bytes,
        "ttl": i.ttl,
        "expires_at": i.expires_at,
        "pinned": i.pinned,
        "options": asdict(i.options),
        "reload_pending": i.reload_pending,
    }


@routes.get("/api/v1/models")
async def models(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    return web.json_response(
        {"models": [s.as_dict() for s in service.models.all(scope_of(request))]}
    )


@routes.get("/api/v1/ps")
async def ps(request: web.Request) -> web.Response:
    service, scope = request.app[SERVICE], scope_of(request)
    return web.json_response(
        {
            "models": [loaded_json(i) for i in service.models.loaded(scope)],
            "loading": service.models.loading(scope),
            "memory": service.models.memory(),
        }
    )


@routes.post("/api/v1/models/load")
async def load(request: web.Request) -> web.Response:
    """{"model": ID, "options": {...}, "force": false, "ttl": 300 | "5m" | -1, "pin": bool,
    "wait": false} -> {"id", "action": loaded | reloaded | unchanged, "options",
    "context_length"} plus the model's ps fields. Options not given resolve as a fresh load
    would; other options than the loaded ones reload it (409 model_busy while requests run on
    it, unless "wait")."""
    service = request.app[SERVICE]
    b = Body(await read_json_body(request))
    model_id = b.text("model", required=True) or ""
    options = validate_options(b.data.get("options") or {}, where="options")
    pin = b.data.get("pin")
    if pin is not None and not isinstance(pin, bool):
        raise InvalidRequest("'pin' must be a boolean", param="pin")
    # the scheduler's own answer says which of loaded / reloaded / unchanged it did
    result = await service.models.load_result(
        model_id,
        options,
        force=b.flag("force"),
        ttl=parse_ttl(b),
        pin=pin,
        wait=b.flag("wait"),
        scope=scope_of(request),
    )
    info = next((i for i in service.models.loaded() if i.model_id == model_id), None)
    body: dict[str, Any] = {"id": model_id, "state": "loaded"}
    if info is not None:
        body.update(loaded_json(info))
    body.update(
        action=result.action,
        options=asdict(result.options),
        context_length=result.context_length,
    )
    return web.json_response(body)


@routes.post("/api/v1/models/unload")
async def unload(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    b = Body(await read_json_body(request))
    model_id = b.text("model", required=True) or ""
    service.models.get(model_id, scope_of(request))  # 404 for unknown ids
    was_loaded = await service.models.unload(model_id, scope_of(request))
    return web.json_response({"id": model_id, "state": "not-loaded", "was_loaded": was_loaded})


@routes.post("/api/v1/models/pin")
async def pin(request: web.Request) -> web.Response:
    """{"model": ID, "pinned": true|false}"""
    service = request.app[SERVICE]
    b = Body(await read_json_body(request))
    model_id = b.text("model", required=True) or ""
    service.models.set_pinned(model_id, b.flag("pinned", True), scope_of(request))
    return web.json_response({"id": model_id, "pinned": b.flag("pinned", True)})


@routes.post("/api/v1/models/estimate")
async def estimate(request: web.Request) -> web.Response:
    """{"model": ID, "options": {...}} -> bytes by part, the budget and whether it fits."""
    service = request.app[SERVICE]
    b = Body(await read_json_body(request))
    model_id = b.text("model", required=True) or ""
    options = validate_options(b.data.get("options") or {}, where="options")
    return web.json_response(
        {"id": model_id, **service.models.estimate(model_id, options, scope_of(request))}
    )


@routes.get("/api/v1/models/{model_id:.+}/preset")
async def get_preset(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    model_id = request.match_info["model_id"]
    preset = service.models.preset(model_id, scope_of(request))
    return web.json_response({"id": model_id, "preset": preset})


@routes.put("/api/v1/models/{model_id:.+}/preset")
async def put_preset(request: web.Request) -> web.Response:
    """Replace the model's preset (load options plus "ttl" and "pinned"); {} clears it."""
    service = request.app[SERVICE]
    model_id = request.match_info["model_id"]
    service.models.get(model_id, scope_of(request))
    b = Body(await read_json_body(request))
    raw = b.data.get("preset", b.data)
    if "ttl" in raw and raw["ttl"] is not None:
        ttl = parse_keep_alive(raw["ttl"], param="preset.ttl")
        raw = {**raw, "ttl": -1 if ttl is None else ttl}
    saved = service.models.save_preset(model_id, raw, scope_of(request))
    return web.json_response({"id": model_id, "preset": saved})
