"""Named keys at the edge: who is calling, whether their role allows the route, and
their token buckets (plus the server-wide one). The middleware awaits :meth:`KeyGuard.enter`
before the body is read (one request; a key in token debt waits here), the core charges the
tokens a parsed request can cost through :meth:`KeyGuard.charger`, and the middleware awaits
:meth:`KeyGuard.settle` with the real usage when the handler is done.

The buckets are the in-process ones (app/core/gateway/ratelimit.py), or, with shared state,
a ``SharedBuckets`` (app/redis_state/limits.py) while it answers: the guard only chooses
between them (the bucket math lives in each). While the shared state is unreachable,
``state.limits_on_failure`` says what happens: ``open`` admits on the in-process buckets,
``closed`` refuses a limited caller with 503 ``state_unavailable``. A caller with no limits
costs no round trip at all.
Tested by tests/server/keys/test_named_keys_api.py, tests/server/test_security.py and
tests/e2e/shared_state/test_shared_limits.py."""

from __future__ import annotations

import asyncio
import hmac
import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from aiohttp import web

from app.core.gateway.keys import DEFAULT_NAME, ApiKey, KeyStore, cache_partition, hash_secret
from app.core.gateway.ratelimit import (
    UNCAPPED_TOKENS,
    Clock,
    Cost,
    Limits,
    SharedBuckets,
    Tier,
    Verdict,
    admit,
)
from app.errors import (
    PermissionDenied,
    RateLimited,
    RequestOverRateLimit,
    StateUnavailable,
    Unauthorized,
)

log = logging.getLogger(__name__)

FLUSH_EVERY_S = 30.0  # last_used_at reaches the file at most this often (and at shutdown)
RATE_HEADERS = web.RequestKey("hearth_rate_headers", dict)
# the calling key's name once identified (also on requests then refused 403/429): for records
KEY_NAME = web.RequestKey("hearth_key_name", str)

# the management routes only admin keys may call: load, unload, pin, presets, pull, downloads,
# keys, providers (and Ollama's pull/delete family, refused before they could exist)
_ADMIN_PATHS = frozenset(
    {"/api/v1/models/load", "/api/v1/models/unload", "/api/v1/models/pin"}
    | {"/api/pull", "/api/delete", "/api/push", "/api/copy", "/api/create"}
)
_ADMIN_PREFIXES = ("/api/v1/pull", "/api/v1/downloads", "/api/v1/keys", "/api/v1/providers")


def is_management(path: str) -> bool:
    return (
        path in _ADMIN_PATHS
        or path.startswith(_ADMIN_PREFIXES)
        or (path.startswith("/api/v1/models/") and path.endswith("/preset"))
    )


@dataclass(frozen=True, slots=True)
class Caller:
    """The key a request came with (None name: no key needed, none given)."""

    name: str | None
    admin: bool
    models: tuple[str, ...] = ()
    partition: str = ""  # its response-cache partition ("" without a key)


@dataclass(slots=True)
class Admission:
    caller: Caller
    tiers: list[Tier]
    shared: bool = False  # charged in the shared buckets (its settle goes there too)
    charged: float = 0.0  # tokens charged so far: what the parsed request can cost
    headers: dict[str, str] = field(default_factory=dict)


def token_from(request: web.Request) -> str:
    auth = request.headers.get("Authorization", "")
    if auth[:7].lower() == "bearer ":
        return auth[7:].strip()
    return request.headers.get("x-api-key", "")


def _refusal(verdict_wait: float, limit: str, headers: dict[str, str]) -> RateLimited:
    err = RateLimited(
        f"rate limit reached ({limit} per minute); retry in {math.ceil(verdict_wait)}s",
        retry_after=max(1, math.ceil(verdict_wait)),
    )
    err.headers = headers  # type: ignore[attr-defined]
    return err


def _over_limit(c: Cost, tpm: int, whose: str) -> RequestOverRateLimit:
    cap = "its max_tokens" if c.capped else f"no max_tokens: {UNCAPPED_TOKENS} a generation"
    err = RequestOverRateLimit(
        f"this request can cost up to {c.total} tokens (about {c.prompt} of prompt plus "
        f"{c.completion} to generate: {cap}), more than the {tpm} tokens per minute {whose} "
        "allows; lower max_tokens or shorten the prompt"
    )
    err.headers = {"x-should-retry": "false"}  # type: ignore[attr-defined]
    return err


class KeyGuard:
    def __init__(
        self,
        store: KeyStore | None,
        default_hashes: tuple[str, ...] = (),
        global_limits: Callable[[], tuple[int, int]] = lambda: (0, 0),
        *,
        clock: Clock = time.monotonic,
        shared: SharedBuckets | None = None,
        on_failure: Callable[[], str] = lambda: "open",
    ) -> None:
        self.store = store
        self.default_hashes = default_hashes
        self._global_limits = global_limits
        self.clock = clock
        self.shared = shared  # None: the in-process buckets only
        self._on_failure = on_failure  # state.limits_on_failure: "open" or "closed"
        self._buckets: dict[str, Limits] = {}  # key name (or "" for global) -> its buckets
        self._flushed_at = time.monotonic()
        self._flushing = False

    def keys(self) -> dict[str, ApiKey]:
        return self.store.all() if self.store is not None else {}

    def required(self) -> bool:
        return bool(self.default_hashes or self.keys())

    def _limits(self, tier: Tier) -> Limits:
        cur = self._buckets.get(tier.name)
        if cur is None or (cur.rpm, cur.tpm) != (tier.rpm, tier.tpm):  # new, or changed
            cur = self._buckets[tier.name] = Limits(tier.rpm, tier.tpm, self.clock)
        return cur

    def _tiers(self, caller: Caller) -> list[Tier]:
        """The caller's limited tiers: its key's, then the server-wide one."""
        tiers: list[Tier] = []
        key = self.keys().get(caller.name or "") if caller.name != DEFAULT_NAME else None
        if key is not None and (key.rpm or key.tpm):
            tiers.append(Tier("key:" + key.name, key.rpm, key.tpm))
        g_rpm, g_tpm = self._global_limits()
        if g_rpm or g_tpm:
            tiers.append(Tier("", g_rpm, g_tpm))
        return tiers

    async def _admit(self, admission: Admission, tokens: float, requests: float) -> Verdict:
        """The shared buckets while they answer, else (``open``) the in-process ones."""
        if not admission.tiers:
            return Verdict(0.0, {})
        if self.shared is not None:
            verdict = None
            if self.shared.usable:
                verdict = await self.shared.admit(admission.tiers, tokens, requests)
            if verdict is not None:
                admission.shared = True
                return verdict
            if self._on_failure() == "closed":
                raise StateUnavailable(
                    "the shared rate limits cannot be checked now (the shared state is "
                    "unreachable); retry shortly"
                )
        admission.shared = False
        return admit([self._limits(t) for t in admission.tiers], tokens, requests)

    def identify(self, token: str) -> Caller:
        """Raises Unauthorized: keys exist and ``token`` is none of them."""
        keys = self.keys()
        if not (self.default_hashes or keys):
            return Caller(None, admin=True)
        digest = hash_secret(token) if token else ""
        ok_default = False
        for h in self.default_hashes:  # every comparison made, each in constant time
            ok_default |= hmac.compare_digest(digest, h)
        named = self.store.match(digest) if token and self.store is not None else None
        if ok_default:
            return Caller(DEFAULT_NAME, admin=True, partition=cache_partition(digest))
        if named is None:
            raise Unauthorized(
                "Invalid or missing API key. Send it as 'Authorization: Bearer <key>'."
            )
        return Caller(named.name, named.admin, named.models, cache_partition(named.hash))

    async def enter(self, request: web.Request) -> Admission:
        """Who is calling, whether they may use this route, and their buckets' admission.

        Raises:
            Unauthorized (401), PermissionDenied (403), RateLimited (429, with the headers),
            StateUnavailable (503: shared limits unreachable and ``limits_on_failure: closed``).
        """
        caller = self.identify(token_from(request))
        request[KEY_NAME] = caller.name or ""
        if not caller.admin and is_management(request.path):
            raise PermissionDenied(
                f"the key '{caller.name}' may not use management routes (it is not an admin key)"
            )
        admission = Admission(caller, self._tiers(caller))
        # one request, no tokens yet (the body is not read): a key in token debt waits here
        verdict = await self._admit(admission, 0.0, 1.0)
        if verdict.wait > 0:
            raise _refusal(verdict.wait, verdict.limit, verdict.headers)
        admission.headers = verdict.headers
        if verdict.headers:
            request[RATE_HEADERS] = admission.headers
        if caller.name not in (None, DEFAULT_NAME) and self.store is not None:
            self.store.note_use(caller.name or "")
            self._maybe_flush()
        return admission

    def charger(self, admission: Admission) -> Callable[[Cost], Awaitable[None]] | None:
        """What the core awaits with a parsed request's cost (None: no token limit applies)."""
        if not any(t.tpm for t in admission.tiers):
            return None

        async def charge(c: Cost) -> None:
            for t in admission.tiers:
                if t.tpm and c.total > t.tpm:
                    whose = "this key" if t.name else "this server"
                    raise _over_limit(c, t.tpm, whose)
            verdict = await self._admit(admission, float(c.total), 0.0)
            if verdict.wait > 0:
                raise _refusal(verdict.wait, verdict.limit, verdict.headers)
            admission.charged += c.total
            admission.headers.update(verdict.headers)  # the remaining tokens, after the charge

        return charge

    async def settle(self, admission: Admission, used_tokens: int | None) -> None:
        """Charge the request's real tokens (prompt + completion) instead of what admission
        charged, where it was charged; None: the real usage is unknown (a stream cut short),
        the charge stands."""
        if used_tokens is None or not any(t.tpm for t in admission.tiers):
            return
        delta = used_tokens - admission.charged
        if admission.shared and self.shared is not None:
            await self.shared.settle(admission.tiers, delta)  # Redis gone: the charge stands
            return
        for t in admission.tiers:
            self._limits(t).settle(delta)

    def _maybe_flush(self) -> None:
        now = time.monotonic()
        if self._flushing or now - self._flushed_at < FLUSH_EVERY_S or self.store is None:
            return
        self._flushed_at, self._flushing = now, True
        task = asyncio.get_running_loop().run_in_executor(None, self.store.flush_uses)
        task.add_done_callback(self._flushed)

    def _flushed(self, fut: asyncio.Future[int]) -> None:
        self._flushing = False
        if not fut.cancelled() and fut.exception() is not None:
            log.warning("could not record the keys' last use: %s", fut.exception())

    def flush(self) -> None:
        if self.store is not None:
            try:
                self.store.flush_uses()
            except OSError as e:
                log.warning("could not record the keys' last use: %s", e)


async def add_rate_headers(request: web.Request, resp: web.StreamResponse) -> None:
    """on_response_prepare: a limited caller's buckets, on every response (streams too)."""
    for k, v in request.get(RATE_HEADERS, {}).items():
        resp.headers.setdefault(k, v)
