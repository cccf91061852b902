"""Hub downloads under /api/v1/: pull (NDJSON progress), list, pause/resume/cancel/retry, search.

Used by ``hearth pull`` while a server (or the app) runs, and by scripts. The edge middleware's
Host/Origin/API-key checks apply to every route here, before any download starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any

from aiohttp import web

from app.core.hub.downloads import DownloadManager, DownloadStatus
from app.core.service import Hearth
from app.errors import (
    AccessDenied,
    AmbiguousChoice,
    HearthError,
    InvalidRequest,
    RuntimeUnavailable,
)
from app.server.edge.body import read_json_body
from app.server.protocols.common import Body
from app.server.protocols.openai.render import error_body
from app.server.state import SERVICE

log = logging.getLogger(__name__)
routes = web.RouteTableDef()
HEARTBEAT_S = 10.0


def _manager(service: Hearth) -> DownloadManager:
    dm = service.hub
    if dm is None:
        raise RuntimeUnavailable("downloads are not available in this Hearth")
    return dm


def error_object(e: HearthError) -> dict[str, Any]:
    """The error shape of every Hearth API, plus ``choices`` / ``url`` where they help."""
    err = error_body(e)["error"]
    if isinstance(e, AmbiguousChoice):
        err["choices"] = list(e.choices)
    if isinstance(e, AccessDenied) and e.url:
        err["url"] = e.url
    return err


def _error_response(e: HearthError) -> web.Response:
    return web.json_response({"error": error_object(e)}, status=e.status)


def progress_line(s: DownloadStatus) -> dict[str, Any]:
    return {
        "status": s.state,
        "id": s.id,
        "name": s.name,
        "file": s.current_file,
        "completed": s.bytes_done,
        "total": s.total_bytes,
        "speed_bps": round(s.speed_bps, 1),
        "eta_s": None if s.eta_s is None else round(s.eta_s, 1),
        "attempt": s.attempt,
    }


@routes.post("/api/v1/pull")
async def pull(request: web.Request) -> web.StreamResponse:
    """Start (or join) a download and stream NDJSON progress until it ends.

    Errors found before any byte moves (unknown repo, refused, ambiguous, gated) answer with
    their HTTP status; later ones end the stream with ``{"status": "error", "error": {...}}``.
    A client that disconnects leaves the download running (see /api/v1/downloads).
    """
    service = request.app[SERVICE]
    dm = _manager(service)
    ref = Body(await read_json_body(request)).text("model", required=True) or ""
    try:
        plan = await dm.resolve(ref)
        status = await dm.start(plan)
    except HearthError as e:
        return _error_response(e)
    resp = web.StreamResponse(
        headers={"Content-Type": "application/x-ndjson", "Cache-Control": "no-cache"}
    )
    await resp.prepare(request)

    async def send(obj: dict[str, Any]) -> None:
        await resp.write(json.dumps(obj, separators=(",", ":")).encode() + b"\n")

    updates: asyncio.Queue[DownloadStatus] = asyncio.Queue()

    async def follow() -> None:
        async for s in dm.watch(status.id):
            updates.put_nowait(s)

    follower = asyncio.create_task(follow())
    try:
        await send({"status": "queued", "id": status.id, "model": ref, "total": status.total_bytes})
        while True:
            try:
                s = await asyncio.wait_for(updates.get(), HEARTBEAT_S)
            except TimeoutError:
                s = dm.get(status.id)  # a heartbeat keeps proxies and clients from timing out
            if s.state in ("completed", "failed", "cancelled"):
                break
            await send(progress_line(s))
        try:
            model = await dm.wait(status.id)
        except HearthError as e:
            await send({"status": "error", "id": status.id, "error": error_object(e)})
        else:
            await send(
                {
                    "status": "success",
                    "id": status.id,
                    "model": model.id,
                    "path": model.path,
                    "format": model.format,
                    "projector": model.projector_summary(),
                    "projector_refused": model.extra.get("projector_refused"),
                }
            )
        await resp.write_eof()
    except (ConnectionError, asyncio.CancelledError):
        log.info("pull %s: the client left; the download goes on", status.id)
    finally:
        follower.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await follower
    return resp


@routes.get("/api/v1/downloads")
async def downloads(request: web.Request) -> web.Response:
    dm = _manager(request.app[SERVICE])
    return web.json_response({"downloads": [s.as_dict() for s in dm.list()]})


@routes.get("/api/v1/downloads/{id}")
async def download(request: web.Request) -> web.Response:
    dm = _manager(request.app[SERVICE])
    return web.json_response(dm.get(request.match_info["id"]).as_dict())


@routes.post("/api/v1/downloads/{id}/{action}")
async def control(request: web.Request) -> web.Response:
    dm = _manager(request.app[SERVICE])
    action = request.match_info["action"]
    ops = {"pause": dm.pause, "resume": dm.resume, "cancel": dm.cancel, "retry": dm.retry}
    if action not in ops:
        raise InvalidRequest(f"unknown action '{action}' (pause, resume, cancel, retry)")
    s = await ops[action](request.match_info["id"])
    return web.json_response(s.as_dict())


@routes.get("/api/v1/hub/search")
async def search(request: web.Request) -> web.Response:
    dm = _manager(request.app[SERVICE])
    q = request.query
    fmt = q.get("format", "gguf")
    if fmt not in ("gguf", "mlx", "whisper", "any"):
        raise InvalidRequest("'format' must be gguf, mlx, whisper or any", param="format")
    sort = q.get("sort", "downloads")
    if sort not in ("downloads", "likes", "recent", "created"):
        raise InvalidRequest("'sort' must be downloads, likes, recent or created", param="sort")
    try:
        limit = int(q.get("limit", "30"))
    except ValueError:
        raise InvalidRequest("'limit' must be an integer", param="limit") from None
    results = await dm.hub.search(
        q.get("q", ""),
        format=None if fmt == "any" else fmt,  # type: ignore[arg-type]
        sort=sort,  # type: ignore[arg-type]
        author=q.get("author") or None,
        limit=max(1, min(limit, 500)),
    )
    return web.json_response({"models": [r.as_dict() for r in results]})


@routes.get("/api/v1/hub/models/{owner}/{name}")
async def repo(request: web.Request) -> web.Response:
    dm = _manager(request.app[SERVICE])
    repo_id = f"{request.match_info['owner']}/{request.match_info['name']}"
    info = await dm.hub.repo(repo_id, with_fit=request.query.get("fit", "true") != "false")
    return web.json_response(info.as_dict())
