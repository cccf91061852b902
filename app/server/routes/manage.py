"""The keys and providers management routes: ``/api/v1/keys`` and
``/api/v1/providers``, admin keys only (app/server/keyguard.py refuses the others with 403
before the body is read).

They edit the same files as ``hearth keys`` and ``hearth providers`` (through the same stores),
so a change takes effect at the next request; with shared state the keys live in Redis instead
(app/redis_state/keys.py), and every gateway of the team honours a change within 2 s (a change
while Redis is unreachable is refused with 503 ``state_unavailable``).

Nothing here ever answers a secret but a new key's, once; a provider's API key goes into its
0600 file and never into a listing, a log line or the request records (its body is not kept
even with ``records.log_content``)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiohttp import web

from app.core.gateway.keys import KeyStore
from app.core.gateway.providers.store import (
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_FIRST_TOKEN_TIMEOUT,
    DEFAULT_IDLE_TIMEOUT,
    ProviderConfig,
    check,
)
from app.errors import InvalidRequest, NotFound
from app.server.edge.body import read_body
from app.server.protocols.common import Body, parse_json
from app.server.state import SERVICE, STATE
from app.settings import generate_key

log = logging.getLogger(__name__)

routes = web.RouteTableDef()

_KEY_FIELDS = frozenset({"name", "rpm", "tpm", "models", "admin"})
_PROVIDER_FIELDS = frozenset(
    {"name", "url", "kind", "prefix", "api_key"}
    | {"connect_timeout", "first_token_timeout", "idle_timeout", "follow_redirects"}
)
MAX_LIMIT = 100_000_000  # per minute: the GUI's spin box allows as much


async def _body(request: web.Request, allowed: frozenset[str]) -> Body:
    """The JSON object, read without noting it for the records (it may carry an API key);
    unknown fields are refused, so a typo never silently drops a limit."""
    raw = await read_body(request, request.app[STATE].settings.max_body_bytes)
    data = parse_json(raw)
    for k in data:
        if k not in allowed:
            raise InvalidRequest(f"unknown field '{k}'", param=k)
    return Body(data)


def _keys(request: web.Request) -> KeyStore:
    guard = request.app[STATE].guard
    if guard is None or guard.store is None:
        raise InvalidRequest("named keys are not available on this server")
    return guard.store


def _key_listing(store: KeyStore) -> list[dict[str, Any]]:
    # "" is a broken file's placeholder that refuses every key: not a key to list
    return [k.public() for k in store.all().values() if k.name]


# -- keys ----------------------------------------------------------------------------------------
@routes.get("/api/v1/keys")
async def list_keys(request: web.Request) -> web.Response:
    """``{"keys": [...]}``: the objects of ``hearth keys ls --json`` (no secrets, no hashes)."""
    store = _keys(request)
    return web.json_response({"keys": await asyncio.to_thread(_key_listing, store)})


@routes.post("/api/v1/keys")
async def add_key(request: web.Request) -> web.Response:
    """{name, rpm?, tpm?, models?, admin?} -> 201 with the listing's fields and ``key``, the
    secret, shown this once (only its hash is stored). 409 when the name is taken."""
    store = _keys(request)
    b = await _body(request, _KEY_FIELDS)
    name = b.text("name", required=True) or ""
    rpm = b.integer("rpm", 0, lo=0, hi=MAX_LIMIT) or 0
    tpm = b.integer("tpm", 0, lo=0, hi=MAX_LIMIT) or 0
    models = b.data.get("models") or []
    if not isinstance(models, list) or not all(isinstance(m, str) for m in models):
        raise InvalidRequest("'models' must be a list of model patterns", param="models")
    admin = b.flag("admin")
    secret = generate_key()
    key = await asyncio.to_thread(
        store.add, name, secret, rpm=rpm, tpm=tpm, models=models, admin=admin
    )
    log.info("key %s added over HTTP (%s)", key.name, "admin" if key.admin else "user")
    return web.json_response(key.public() | {"key": secret}, status=201)


@routes.delete("/api/v1/keys/{name}")
async def remove_key(request: web.Request) -> web.Response:
    """200 ``{"name", "removed": true}``; 404 for a name that is no key. The key is refused
    from the next request on."""
    store = _keys(request)
    name = request.match_info["name"]
    if not await asyncio.to_thread(store.remove, name):
        raise NotFound(f"no key '{name}'", param="name")
    log.info("key %s removed over HTTP", name)
    return web.json_response({"name": name, "removed": True})


# -- providers -------------------------------------------------------------------------------------
@routes.get("/api/v1/providers")
async def list_providers(request: web.Request) -> web.Response:
    """``{"providers": [...]}``: the objects of ``hearth providers ls --json`` (the server's
    live states; never a provider's API key)."""
    service = request.app[SERVICE]
    return web.json_response(
        {"providers": [s.as_json() for s in service.routing.provider_statuses()]}
    )


@routes.post("/api/v1/providers")
async def add_provider(request: web.Request) -> web.Response:
    """{name, url, kind?, prefix?, api_key?, connect_timeout?, first_token_timeout?,
    idle_timeout?, follow_redirects?}: add (201) or replace (200) a provider, as ``hearth providers add``. Without
    ``kind`` the engine is asked (``detect_warning`` says why that failed; "openai" is kept)."""
    service = request.app[SERVICE]
    if not service.routing.has_providers:
        raise InvalidRequest("remote providers are not available on this server")
    b = await _body(request, _PROVIDER_FIELDS)
    api_key = b.text("api_key") or None
    kind = b.text("kind")
    cfg = check(
        ProviderConfig(
            name=b.text("name", required=True) or "",
            url=b.text("url", required=True) or "",
            kind=kind or "openai",
            prefix=b.text("prefix") or "",
            connect_timeout=b.number(
                "connect_timeout", DEFAULT_CONNECT_TIMEOUT, lo=0.001, hi=86_400
            ),
            first_token_timeout=b.number(
                "first_token_timeout", DEFAULT_FIRST_TOKEN_TIMEOUT, lo=0.001, hi=86_400
            ),
            idle_timeout=b.number("idle_timeout", DEFAULT_IDLE_TIMEOUT, lo=0.001, hi=86_400),
            follow_redirects=b.flag("follow_redirects"),
        )
    )
    why = None
    if kind is None:
        cfg, why = await service.routing.detect_kind(cfg, api_key)
    existed = service.routing.provider(cfg.name) is not None
    saved = service.routing.add_provider(cfg, api_key)  # on the loop, where the core's state lives
    log.info("provider %s %s over HTTP", saved.name, "replaced" if existed else "added")
    body: dict[str, Any] = saved.as_json() | {"has_api_key": bool(api_key)}
    if why:
        body["detect_warning"] = why
    return web.json_response(body, status=200 if existed else 201)


@routes.delete("/api/v1/providers/{name}")
async def remove_provider(request: web.Request) -> web.Response:
    """200 ``{"name", "removed": true}`` (its key goes too); 404 for no such provider."""
    service = request.app[SERVICE]
    name = request.match_info["name"]
    if not service.routing.remove_provider(name):
        raise NotFound(f"no provider '{name}'", param="name")
    log.info("provider %s removed over HTTP", name)
    return web.json_response({"name": name, "removed": True})


@routes.post("/api/v1/providers/{name}/test")
async def test_provider(request: web.Request) -> web.Response:
    """``hearth providers test --json``'s object: health, model list, a 1-token chat."""
    service = request.app[SERVICE]
    name = request.match_info["name"]
    if service.routing.provider(name) is None:
        raise NotFound(f"no provider '{name}'", param="name")
    result = await service.routing.test_provider(name)
    return web.json_response(result.as_json())
