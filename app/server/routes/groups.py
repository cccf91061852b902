"""The replica groups routes: ``GET /api/v1/providers/groups``, ``PUT`` and ``DELETE
/api/v1/providers/groups/{name}``, admin keys only (under ``/api/v1/providers``, which
app/server/keyguard.py keeps to admin keys). They edit ``groups.json`` through the same store
as ``hearth providers group``, so a change takes effect at the next request.
Tested by tests/server/routes/test_groups.py."""

from __future__ import annotations

import logging

from aiohttp import web

from app.core.gateway.groups.store import from_json
from app.errors import InvalidRequest, NotFound
from app.server.edge.body import read_body
from app.server.protocols.common import parse_json
from app.server.state import SERVICE, STATE

log = logging.getLogger(__name__)

routes = web.RouteTableDef()


@routes.get("/api/v1/providers/groups")
async def list_groups(request: web.Request) -> web.Response:
    """``{"groups": [...]}``: each group, its settings, each member's state and in flight."""
    groups = request.app[SERVICE].routing.groups
    return web.json_response({"groups": groups.statuses() if groups is not None else []})


@routes.put("/api/v1/providers/groups/{name}")
async def put_group(request: web.Request) -> web.Response:
    """{members, strategy?, prefix_tokens?, health_interval_s?, health_timeout_s?,
    health_path?, cooldown_s?, failures_to_open?}: create (201) or replace (200) a group."""
    service = request.app[SERVICE]
    name = request.match_info["name"]
    raw = await read_body(request, request.app[STATE].settings.max_body_bytes)
    cfg = from_json(name, parse_json(raw))
    groups = service.routing.groups
    if groups is None:
        raise InvalidRequest("replica groups are not available on this server")
    existed = name in groups.store.all(fresh=True)
    saved = groups.set(cfg)
    log.info("group %s %s over HTTP", name, "replaced" if existed else "added")
    return web.json_response(saved.as_json(), status=200 if existed else 201)


@routes.delete("/api/v1/providers/groups/{name}")
async def remove_group(request: web.Request) -> web.Response:
    """200 ``{"name", "removed": true}``; 404 for no such group."""
    service = request.app[SERVICE]
    name = request.match_info["name"]
    groups = service.routing.groups
    if groups is None or not groups.remove(name):
        raise NotFound(f"no group '{name}'", param="name")
    log.info("group %s removed over HTTP", name)
    return web.json_response({"name": name, "removed": True})
