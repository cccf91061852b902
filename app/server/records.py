"""The server's side of the request records: what each request's log entry gathers
while it runs, and the record written when it ends (app/core/gateway/records.py stores it).

The edge middleware calls :func:`begin` and :func:`finish`; the streaming path reports the first
token, the answer's text and each generation's end here. Other parts fill in the log entry's
``key`` (the key's name), ``cache`` and ``trace_id``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from app.core.gateway.records import RecordStore, RequestRecord
from app.core.requests import RequestContext
from app.core.service import Hearth
from app.core.types import Delta
from app.errors import HearthError
from app.server.routes import owner
from app.server.state import REQUEST_LOG, SERVICE, context_of

log = logging.getLogger(__name__)

MAX_ROUTE_CHARS = 200


@dataclass(frozen=True, slots=True)
class Recorder:
    """The server's record store and what it keeps of content (``records`` settings)."""

    store: RecordStore
    log_content: bool = False
    content_max_chars: int = 4096


RECORDER = web.AppKey("recorder", Recorder)
TRACE_ID = web.RequestKey("hearth_trace_id", str)  # set by app/server/telemetry.py when tracing


def begin(request: web.Request) -> None:
    """Start the request's record (the log entry exists already)."""
    request[REQUEST_LOG].update(
        wall=time.time(),  # the record's time ("arrived" is the perf_counter TTFT starts from)
        requested_model=None,  # the model asked for, once a generation names the one that answered
        answered_by=None,
        key=None,  # the API key's name: "default" for the single --api-key / HEARTH_API_KEY
        stream=False,
        error_code=None,
        queue_ms=None,
        cache=None,  # the response cache's result, once there is one
        trace_id=request.get(TRACE_ID),  # the OpenTelemetry trace id (hex) when tracing
        request_text=None,
        response_text=[],
        response_chars=0,
    )


def timing_of(request: web.Request) -> RequestContext:
    """What the core measured for the request (its load wait), on its context."""
    return context_of(request)


def _content_cap(request: web.Request) -> int:
    rec = request.app.get(RECORDER)
    return rec.content_max_chars if rec is not None and rec.log_content else 0


def note_body(request: web.Request, raw: bytes) -> None:
    """The request body, when content is recorded (capped)."""
    cap = _content_cap(request)
    info = request.get(REQUEST_LOG)
    if cap and info is not None:
        info["request_text"] = raw[: cap * 4].decode("utf-8", "replace")[:cap]


def note_model(request: web.Request, body: Any) -> None:
    """The body's ``model``, until a route names the one it asked for (capped)."""
    info = request.get(REQUEST_LOG)
    model = body.get("model") if isinstance(body, dict) else None
    if info is not None and info["model"] is None and isinstance(model, str):
        info["model"] = model[:MAX_ROUTE_CHARS]


def note_delta(request: web.Request, d: Delta) -> None:
    """A generation's delta: the answer's text, when content is recorded (the time to first
    token is streaming.timed's ``ttft_ms``)."""
    info = request.get(REQUEST_LOG)
    if info is None or "response_chars" not in info:
        return
    cap = _content_cap(request)
    room = cap - info["response_chars"]
    if room > 0 and d.text:
        piece = d.text[:room]
        info["response_text"].append(piece)
        info["response_chars"] += len(piece)


def note_start(request: web.Request, model: str, stream: bool) -> None:
    """A generation route is about to answer, with ``model`` (an alias's target, auto's pick)."""
    info = request.get(REQUEST_LOG)
    if info is not None and "answered_by" in info:
        info["answered_by"], info["stream"] = model, stream


def note_final(request: web.Request, model: str, final: Delta) -> None:
    """A generation ended: the model that answered, and its queue wait."""
    info = request.get(REQUEST_LOG)
    if info is None or "answered_by" not in info:
        return
    if info["requested_model"] is None:
        info["requested_model"] = info["model"]  # the routes put the asked-for model here
    info["answered_by"] = model
    if final.timings is not None:
        info["queue_ms"] = max(info["queue_ms"] or 0.0, final.timings.queue_ms)


def note_cache(request: web.Request, result: str) -> None:
    """The response cache's result: hit | semantic | miss | bypass."""
    info = request.get(REQUEST_LOG)
    if info is not None:
        info["cache"] = result


def note_error(request: web.Request, err: HearthError) -> None:
    info = request.get(REQUEST_LOG)
    if info is not None:
        info["error_code"] = err.code


def route_of(request: web.Request) -> str:
    """The matched route's pattern (bounded: no ids or free text), or the path (capped)."""
    resource = request.match_info.route.resource
    if resource is not None:
        return resource.canonical
    return request.path[:MAX_ROUTE_CHARS]


def protocol_of(request: web.Request) -> str:
    p = owner(request.match_info.handler)
    if p is not None:
        return p.name
    path = request.path
    if path == "/health" or path.startswith("/api/v1/"):
        return "native"
    return "ollama" if path.startswith("/api/") else "openai"


def provider_of(service: Hearth, model_id: str | None) -> str | None:
    """``local`` for a library model, the provider's name for a remote one."""
    if model_id is None:
        return None
    return service.routing.provider_of(model_id)


def record_of(request: web.Request, status: int, started: float) -> RequestRecord:
    """The record of a request that ended now with ``status``."""
    info: dict[str, Any] = request[REQUEST_LOG]
    tps = info["tps"]
    answered = info["answered_by"]
    timing = context_of(request)
    return RequestRecord(
        time=info["wall"],
        route=route_of(request),
        protocol=protocol_of(request),
        model=info["requested_model"] or info["model"],
        answered_by=answered,
        provider=provider_of(request.app[SERVICE], answered),
        key=info["key"],
        stream=bool(info["stream"]),
        status=status,
        error_code=info["error_code"],
        prompt_tokens=info["prompt_tokens"],
        cached_tokens=info["cached_tokens"],
        completion_tokens=info["completion_tokens"],
        ttft_ms=info["ttft_ms"],  # measured by streaming.timed, from the request's arrival
        total_ms=(time.perf_counter() - started) * 1000,
        tokens_per_second=tps if tps > 0 else None,
        queue_ms=info["queue_ms"],
        load_ms=timing.load_ms if timing is not None else None,
        cache=info["cache"],
        trace_id=info["trace_id"],
        method=request.method,
        request_text=info["request_text"],
        response_text="".join(info["response_text"]) if info["response_chars"] else None,
    )


def submit(request: web.Request, status: int, started: float) -> asyncio.Future[None] | None:
    """Queue the request's record (no wait) with the others of its batch: the future is done
    once they are committed (the store's HAND_OVER_S, then at most its COMMIT_WAIT_S)."""
    rec = request.app.get(RECORDER)
    if rec is None or "wall" not in request[REQUEST_LOG]:
        return None
    try:
        return rec.store.append(record_of(request, status, started))
    except Exception:  # a record must never cost the answer
        log.exception("could not record %s %s", request.method, request.path)
        return None
