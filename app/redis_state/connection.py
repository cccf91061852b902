"""One Redis (or Valkey) server shared by every gateway: its clients, and whether it answers.

Both clients (``aio`` for the event loop, ``sync`` for work already off it) come from one URL:
``redis://HOST:PORT/DB``, ``rediss://`` for TLS, a password as ``redis://:PASSWORD@HOST``
(or ``USER:PASSWORD@``). Timeouts are short: a gateway whose Redis hangs must not hang with it.

While a call fails the state is *degraded*: callers use their in-process piece instead (the
``usable`` flag says when to try Redis at all), ``/health`` says so and why, and a counter
counts the failures. A background task pings every ``RETRY_S`` while degraded and marks the
state ``ok`` again once Redis answers, so nothing needs restarting after Redis comes back.
Tested by tests/redis_state/test_connection.py."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import urllib.parse
from collections.abc import Callable
from typing import Any

import redis
import redis.asyncio as aioredis

log = logging.getLogger(__name__)

SCHEMES = ("redis", "rediss", "valkey", "valkeys", "unix")
SOCKET_TIMEOUT_S = 0.5  # one call; a hung Redis degrades the state after this long
CONNECT_TIMEOUT_S = 0.5
RETRY_S = 1.0  # while degraded, a ping this often
NAMESPACE = "hearth:"


def check_url(url: str) -> str:
    """``url`` when it names a Redis server Hearth can use; ValueError (with why) otherwise.
    ``valkey://`` is read as ``redis://`` (the same protocol)."""
    parts = urllib.parse.urlsplit(url.strip())
    if parts.scheme not in SCHEMES:
        raise ValueError(
            f"'{redact(url)}' is not a Redis URL (redis://HOST:PORT/DB, rediss:// for TLS)"
        )
    if parts.scheme != "unix" and not parts.hostname:
        raise ValueError(f"'{redact(url)}' names no host")
    db = parts.path.strip("/")
    if db and not db.isdigit():
        raise ValueError(f"'{redact(url)}': the database is a number (/0, /1...)")
    return url.strip()


def _client_url(url: str) -> str:
    if url.startswith("valkey"):
        return "redis" + url[len("valkey") :]
    return url


def redact(url: str) -> str:
    """The URL without its password (for logs, /health and the GUI)."""
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    user = f"{parts.username}:***@" if parts.username else ":***@"
    return urllib.parse.urlunsplit(parts._replace(netloc=user + host))


class SharedState:
    """The shared Redis of this gateway (see the module doc). Create it on the loop that
    serves; :meth:`start` pings once and starts the reconnect watch."""

    def __init__(
        self,
        url: str,
        *,
        namespace: str = NAMESPACE,
        on_change: Callable[[bool], None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.url = check_url(url)
        self.namespace = namespace
        opts: dict[str, Any] = {
            "socket_timeout": SOCKET_TIMEOUT_S,
            "socket_connect_timeout": CONNECT_TIMEOUT_S,
            "health_check_interval": 10,
            "retry_on_timeout": False,
        }
        self.aio: aioredis.Redis = aioredis.Redis.from_url(_client_url(self.url), **opts)
        self.sync: redis.Redis = redis.Redis.from_url(_client_url(self.url), **opts)
        self._on_change = on_change
        self._clock = clock
        self.healthy = False  # until the first ping answers
        self.reason: str | None = "not connected yet"
        self.since = clock()  # when the current state began
        self.errors = 0  # failed calls, ever (the metric)
        self._watch: asyncio.Task[None] | None = None
        self._closed = False

    # -- names ---------------------------------------------------------------------------------
    def key(self, *parts: str) -> str:
        """A Redis key in Hearth's namespace: ``key("rl", "alice")`` -> ``hearth:rl:alice``."""
        return self.namespace + ":".join(parts)

    @property
    def usable(self) -> bool:
        """Whether to try Redis now (False while degraded: use the in-process piece)."""
        return self.healthy and not self._closed

    # -- outcomes ------------------------------------------------------------------------------
    def failed(self, exc: BaseException) -> None:
        """A call failed (Redis unreachable, timed out, or answered an error): degraded until
        a ping answers. Thread-safe enough: a flag and a counter."""
        self.errors += 1
        why = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        if self.healthy:
            self.healthy = False
            self.since = self._clock()
            log.warning(
                "shared state at %s unreachable (%s): serving on local state", self.shown, why
            )
            self._changed()
        self.reason = why

    def succeeded(self) -> None:
        if not self.healthy:
            self.healthy, self.reason, self.since = True, None, self._clock()
            log.warning("shared state at %s reachable again", self.shown)
            self._changed()

    def _changed(self) -> None:
        if self._on_change is not None:
            with contextlib.suppress(Exception):
                self._on_change(self.healthy)

    @property
    def shown(self) -> str:
        return redact(self.url)

    def status(self) -> dict[str, Any]:
        """What ``/health`` says of it: ``ok`` or ``degraded`` with why, since when."""
        out: dict[str, Any] = {
            "backend": "redis",
            "url": self.shown,
            "state": "ok" if self.healthy else "degraded",
            "since": self.since,
            "errors": self.errors,
        }
        if not self.healthy:
            out["error"] = self.reason
        return out

    # -- life ----------------------------------------------------------------------------------
    async def ping(self) -> bool:
        try:
            await self.aio.ping()
        except (redis.RedisError, OSError) as e:
            self.failed(e)
            return False
        self.succeeded()
        return True

    def check(self) -> bool:
        """:meth:`ping` for callers off the event loop (the CLI, tests): the sync client."""
        try:
            self.sync.ping()
        except (redis.RedisError, OSError) as e:
            self.failed(e)
            return False
        self.succeeded()
        return True

    async def start(self) -> None:
        """Ping once (a Redis that is down now is not fatal: serving starts degraded), then
        watch: while degraded, ping every ``RETRY_S`` until it answers. Again after
        :meth:`close` (the desktop app's server stopped and started): the clients reconnect."""
        if self._closed:
            self._closed, self._watch = False, None
        await self.ping()
        if self._watch is None:
            self._watch = asyncio.ensure_future(self._watch_loop())

    async def _watch_loop(self) -> None:
        while not self._closed:
            await asyncio.sleep(RETRY_S)
            if not self.healthy:
                await self.ping()

    async def close(self) -> None:
        self._closed = True
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
        with contextlib.suppress(Exception):
            await self.aio.aclose()
        with contextlib.suppress(Exception):
            self.sync.close()
