"""The edge of every request: Host and Origin allow-lists, bearer auth, the request's time
limit, the request log, and HearthError -> the error shape of the protocol that owns the route.
Tested by tests/server/telemetry/test_telemetry.py and tests/server/clients/test_ollama_edges.py."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import re
import time
from collections.abc import Awaitable, Callable

from aiohttp import web

from app.core.events import RequestFinished
from app.core.gateway.cache import replay as response_cache
from app.core.gateway.keys import cache_partition, hash_secret
from app.core.util import filecache
from app.errors import (
    Forbidden,
    GenerationCancelled,
    GenerationTimeout,
    HearthError,
    HTTPStatusError,
    Unauthorized,
)
from app.server import records
from app.server.edge.body import too_large
from app.server.keyguard import KEY_NAME, Admission
from app.server.protocols import OLLAMA, OPENAI
from app.server.protocols.base import Protocol
from app.server.routes import owner
from app.server.state import REQUEST_LOG, SERVICE, STATE, ServerState, context_of
from app.server.streaming import DEADLINE, ClientGone
from app.settings import key_matches

log = logging.getLogger(__name__)

# the line per request may wait a fraction of a second in the log file's buffer (the log file,
# app/cli/common.py's PrivateLogFile, flushes it with the next other line or within 0.2 s)
_FLUSH_LATER = {"flush_later": True}
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1", "[::1]"})
PUBLIC_PATHS = frozenset({"/health"})


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def is_ollama_path(path: str) -> bool:
    return path.startswith("/api/") and not path.startswith("/api/v1/")


def protocol_of(request: web.Request) -> Protocol:
    """The protocol that owns the matched route; for a path no route matched (404/405), the
    one its prefix belongs to."""
    p = owner(request.match_info.handler)
    if p is not None:
        return p
    return OLLAMA if is_ollama_path(request.path) else OPENAI


def json_error(
    err: HearthError, protocol: Protocol, headers: dict[str, str] | None = None
) -> web.Response:
    """The error in the shape the protocol's clients expect, with retry hints."""
    h = dict(headers or {})
    if err.status in (400, 401, 403, 404, 413):
        h.setdefault("x-should-retry", "false")
    route = getattr(err, "route", None)  # the gateway's targets tried before this failure
    if route:
        h["x-hearth-route"] = ",".join(route)
    retry = getattr(err, "retry_after", None)
    if retry is not None:
        h["Retry-After"] = str(retry)
    return web.json_response(protocol.error_body(err), status=err.status, headers=h)


def host_name(host_header: str) -> str | None:
    """The host part of a Host header, lowercased; None when malformed."""
    h = host_header.strip().lower()
    if not h:
        return None
    if h.startswith("["):
        end = h.find("]")
        if end == -1:
            return None
        name, rest = h[: end + 1], h[end + 1 :]
        if rest and not (rest.startswith(":") and rest[1:].isdigit()):
            return None
        return name
    name, _, port = h.partition(":")
    if port and not port.isdigit():
        return None
    return name or None


def allowed_hosts(state: ServerState) -> frozenset[str]:
    names = set(LOOPBACK_NAMES)
    names.update(h.lower() for h in state.settings.allowed_hosts)
    # the name the server was bound by and the addresses it is bound to (the printed base URL
    # shows the address); a wildcard bind adds nothing
    for bound in (state.bound_host.lower(), *state.bound_addresses):
        if bound not in ("0.0.0.0", "::", ""):
            names.add(f"[{bound}]" if ":" in bound and not bound.startswith("[") else bound)
    return frozenset(names)


# one serialized origin (RFC 6454): scheme "://" host [":" port], nothing else. Hosts are DNS
# labels, dotted IPv4, or a bracketed IPv6 literal (checked below); no path, userinfo, spaces or lists
_ORIGIN_RE = re.compile(
    r"(?P<scheme>[a-z][a-z0-9+.-]*)://"
    r"(?P<host>\[[0-9a-f:.]+\]|[a-z0-9](?:[a-z0-9-]*[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9-]*[a-z0-9])?)*)"
    r"(?::(?P<port>[0-9]{1,5}))?",
    re.ASCII,
)


def parse_origin(origin: str) -> tuple[str, str, int | None] | None:
    """``(scheme, host, port)`` of one well-formed Origin value, lowercased; None otherwise
    (``null``, two origins, a path, a bracket that is not an IPv6 address...)."""
    m = _ORIGIN_RE.fullmatch(origin.lower())
    if m is None:
        return None
    host = m["host"]
    if host.startswith("["):
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            return None
        host = host[1:-1]
    port = int(m["port"]) if m["port"] is not None else None
    if port is not None and not 0 < port < 65536:
        return None
    return m["scheme"], host, port


def _is_loopback_origin(origin: str) -> bool:
    parsed = parse_origin(origin)
    if parsed is None or parsed[0] not in ("http", "https"):
        return False
    host = parsed[1]
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def origin_allowed(origin: str, state: ServerState) -> bool:
    """An Origin the user listed (exactly), any well-formed one with ``*``, or a loopback one."""
    allowed = state.settings.allowed_origins
    if origin in allowed and not any(c in origin for c in ", \t"):
        return True
    if "*" in allowed:
        return parse_origin(origin) is not None
    return _is_loopback_origin(origin)


@web.middleware
async def edge_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Host and Origin allow-lists, bearer auth, errors in the owning protocol's shape, and
    the request log.

    Host/Origin/auth are checked before the body is read, so a refused request has no effect.
    """
    # a name looked up afresh (missing here, maybe just added by another process) looks at
    # each shared file once a request, however many places miss it (core/util/filecache.py)
    serving = filecache.serving(time.monotonic())
    try:
        return await _edge(request, handler)
    finally:
        filecache.done_serving(serving)


async def _edge(request: web.Request, handler: Handler) -> web.StreamResponse:
    state = request.app[STATE]
    started = time.perf_counter()
    request[REQUEST_LOG] = {
        "model": None,
        "prompt_tokens": 0,
        "completion_tokens": 0,
        "cached_tokens": 0,
        "tps": 0.0,
        "prompt_tps": 0.0,
        "batch_size": 0.0,
        "cpu_busy": False,
        "arrived": started,  # perf_counter: streaming.timed measures the TTFT from it
        "ttft_ms": None,
    }
    records.begin(request)
    cors: dict[str, str] = {}
    protocol = protocol_of(request)
    state.inflight += 1
    try:
        name = host_name(request.headers.get("Host", ""))
        if name is None or name not in allowed_hosts(state):
            raise Forbidden(
                "Host not allowed. Add it to the server's allowed hosts to reach Hearth by this name."
            )
        origins = request.headers.getall("Origin", [])
        if origins:
            origin = origins[0]
            if len(origins) > 1 or not origin_allowed(origin, state):
                raise Forbidden(
                    "Origin not allowed. Add it to the server's allowed origins in Settings."
                )
            cors = {
                "Access-Control-Allow-Origin": origin,
                "Vary": "Origin",
                "Access-Control-Allow-Credentials": "true",
            }
        if request.method == "OPTIONS":
            return web.Response(
                status=204,
                headers={
                    **cors,
                    "Access-Control-Allow-Methods": "GET, POST, DELETE, OPTIONS",
                    "Access-Control-Allow-Headers": request.headers.get(
                        "Access-Control-Request-Headers", "Authorization, Content-Type"
                    ),
                    "Access-Control-Max-Age": "600",
                },
            )
        admission: Admission | None = None
        partition = ""  # the caller's response-cache partition: "" without a key
        if state.guard is not None and request.path not in PUBLIC_PATHS:
            admission = await state.guard.enter(request)  # named keys, roles, rate limits
        elif state.guard is None and state.api_key_hashes and request.path not in PUBLIC_PATHS:
            auth = request.headers.get("Authorization", "")
            token = (
                auth[7:].strip()
                if auth[:7].lower() == "bearer "
                else request.headers.get("x-api-key", "")
            )
            if not token or not key_matches(token, state.api_key_hashes):
                raise Unauthorized(
                    "Invalid or missing API key. Send it as 'Authorization: Bearer <key>'."
                )
            request[REQUEST_LOG]["key"] = "default"  # the single key's name
            partition = cache_partition(hash_secret(token))
        if admission is not None:
            request[REQUEST_LOG]["key"] = request.get(KEY_NAME) or None
            partition = admission.caller.partition
        guard = state.guard
        ctx = context_of(request)  # what the core's stages read of the caller
        ctx.models = (admission.caller.models or None) if admission else None
        ctx.partition = partition
        ctx.cache = response_cache.directive(request.headers.get("x-hearth-cache"))
        ctx.charge = guard.charger(admission) if guard and admission else None
        cut = True  # a request cut short (client gone, our bug): what it was charged stands
        try:
            resp = await _within_time_limit(request, handler)
            cut = False
        except HearthError:
            cut = False
            raise
        finally:
            if admission is not None and guard is not None:
                info = request[REQUEST_LOG]
                used = info["prompt_tokens"] + info["completion_tokens"]
                await guard.settle(admission, None if cut else used)
    except HearthError as e:
        if request[REQUEST_LOG].get("key") is None and request.get(KEY_NAME):
            request[REQUEST_LOG]["key"] = request[KEY_NAME]  # refused (403, 429): still named
        resp = _error(request, e, protocol, getattr(e, "headers", None))
    except web.HTTPRequestEntityTooLarge:
        resp = _error(request, too_large(state.settings.max_body_bytes), protocol)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        code = {404: "not_found", 405: "method_not_allowed"}.get(e.status, "http_error")
        resp = _error(request, HTTPStatusError(e.status, e.reason or "error", code), protocol)
    except (asyncio.CancelledError, ClientGone):  # the client went away (or the server stops)
        records.note_error(request, GenerationCancelled("the client went away"))
        records.submit(request, GenerationCancelled.status, started)
        raise
    except Exception:  # our bug: log it, answer 500 in the same shape
        log.exception("unhandled error on %s %s", request.method, request.path)
        resp = _error(request, HearthError("internal server error (see the Hearth log)"), protocol)
    finally:
        state.inflight -= 1
    if cors and not resp.prepared:
        resp.headers.update(cors)
    _log_request(request, resp, started)
    records.submit(request, resp.status, started)
    return resp


def _error(
    request: web.Request,
    err: HearthError,
    protocol: Protocol,
    headers: dict[str, str] | None = None,
) -> web.Response:
    records.note_error(request, err)
    return json_error(err, protocol, headers)


# long-running by nature: a download's progress stream may last hours
UNTIMED_PREFIXES = ("/api/v1/pull", "/api/v1/downloads")
GRACE_S = 1.0  # after the deadline, for a generation to write its own error event first
PREPARED = web.RequestKey("hearth_prepared", bool)
_BACKSTOP = web.RequestKey("hearth_backstop", bool)


async def mark_prepared(request: web.Request, _resp: web.StreamResponse) -> None:
    request[PREPARED] = True


async def _within_time_limit(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Run the handler under the request's time limit (``server.request_timeout_s``, counted
    from now). Generations end themselves at the deadline with their protocol's error event
    (streaming.timed); anything else still running a moment later (an embedding batch, a wait
    for a load) is cancelled and answered 504, unless its response has already started."""
    loop = asyncio.get_running_loop()
    limit = request.app[STATE].settings.request_timeout_s
    request[DEADLINE] = deadline = loop.time() + limit
    if request.path.startswith(UNTIMED_PREFIXES):
        return await handler(request)
    task = asyncio.current_task()

    def backstop() -> None:
        if task is not None and not request.get(PREPARED):
            request[_BACKSTOP] = True
            task.cancel()

    timer = loop.call_at(deadline + GRACE_S, backstop)
    try:
        return await handler(request)
    except asyncio.CancelledError:
        if task is None or not request.get(_BACKSTOP) or task.uncancel() > 0:
            raise  # the client went away (or the server is stopping): not ours to answer
        raise GenerationTimeout(
            f"the request ran over the server's time limit ({limit:g}s)"
        ) from None
    finally:
        timer.cancel()


def route_pattern(request: web.Request) -> str:
    """The matched route's pattern, never the raw path: "" when no route matched (404, 405)."""
    resource = request.match_info.route.resource
    if resource is None or request.match_info.http_exception is not None:
        return ""
    return resource.canonical


def _log_request(request: web.Request, resp: web.StreamResponse, started: float) -> None:
    info = request[REQUEST_LOG]
    secs = time.perf_counter() - started
    ev = RequestFinished(
        method=request.method,
        path=request.path,
        status=resp.status,
        model=info["model"],
        prompt_tokens=info["prompt_tokens"],
        completion_tokens=info["completion_tokens"],
        seconds=secs,
        tokens_per_second=info["tps"],
        prompt_tokens_per_second=info["prompt_tps"],
        cached_tokens=info["cached_tokens"],
        batch_size=info["batch_size"],
        cpu_busy=info["cpu_busy"],
        route=route_pattern(request),
        ttft_ms=info["ttft_ms"],
        arrived_at=info.get("wall", 0.0),  # pairs the event with its record (the GUI's log)
    )
    note = " (slower: the CPU is busy with other programs)" if info["cpu_busy"] else ""
    log.info(
        "%s %s %d %.3fs%s",
        request.method,
        request.path,
        resp.status,
        secs,
        note,
        extra=_FLUSH_LATER,
    )
    request.app[SERVICE].events.publish(ev)
