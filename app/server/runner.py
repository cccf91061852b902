"""ServerController: starts and stops the aiohttp server on the service loop."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import socket

from aiohttp import web

from app.core.events import ServerStarted, ServerStopped
from app.core.fsutil import atomic_write_json, read_json
from app.core.service import Hearth
from app.errors import ServerError
from app.paths import AppPaths
from app.server.app import STATE, create_app
from app.settings import SettingsStore, hash_key

log = logging.getLogger(__name__)

LOOPBACK_BINDS = frozenset({"127.0.0.1", "localhost", "::1"})


def is_loopback(host: str) -> bool:
    return host in LOOPBACK_BINDS or host.startswith("127.")


def base_url(host: str, port: int) -> str:
    shown = "127.0.0.1" if host in ("0.0.0.0", "") else host
    if ":" in shown and not shown.startswith("["):
        shown = f"[{shown}]"
    return f"http://{shown}:{port}/v1"


class ServerController:
    """Owns one aiohttp runner. Call its coroutines on the service loop."""

    def __init__(self, service: Hearth, settings_store: SettingsStore, paths: AppPaths) -> None:
        self.service = service
        self.settings_store = settings_store
        self.paths = paths
        self._runner: web.AppRunner | None = None
        self._site: web.BaseSite | None = None
        self._app: web.Application | None = None
        self.host: str | None = None
        self.port: int | None = None
        self.extra_key_hashes: tuple[str, ...] = ()

    @property
    def running(self) -> bool:
        return self._runner is not None

    @property
    def base_url(self) -> str | None:
        return base_url(self.host, self.port) if self.running and self.host and self.port else None

    def set_api_key(self, key: str | None) -> None:
        """A key given on the command line or in HEARTH_API_KEY (kept only as a hash)."""
        self.extra_key_hashes = (hash_key(key),) if key else ()

    async def start(self, host: str | None = None, port: int | None = None) -> str:
        """Bind and serve. Returns the base URL.

        Raises:
            ServerError: the port is busy, the address is invalid, or LAN mode lacks an API key.
        """
        if self.running:
            return self.base_url or ""
        settings = self.settings_store.load().server
        host = host or settings.host
        port = settings.port if port is None else port
        keys = tuple(settings.api_key_hashes) + self.extra_key_hashes
        if not is_loopback(host) and not keys:
            raise ServerError(
                f"Refusing to listen on {host} without an API key: anyone on the network could use "
                f"your models. Set an API key (Settings, --api-key or HEARTH_API_KEY) or bind 127.0.0.1."
            )
        app = create_app(self.service, settings, api_key_hashes=keys, bound_host=host)
        # handler_cancellation: a client that disconnects cancels its handler, which cancels
        # the generation within one token
        runner = web.AppRunner(
            app, handler_cancellation=True, access_log=None, shutdown_timeout=5.0
        )
        await runner.setup()
        try:
            sock = _bind(host, port)
        except OSError as e:
            await runner.cleanup()
            if e.errno == errno.EADDRINUSE:
                raise ServerError(
                    f"Port {port} on {host} is already in use. Stop the other program or pick another port."
                ) from e
            raise ServerError(f"Cannot listen on {host}:{port}: {e.strerror or e}") from e
        site = web.SockSite(runner, sock)
        await site.start()
        self._runner, self._site, self._app = runner, site, app
        self.host, self.port = host, sock.getsockname()[1]
        url = self.base_url or ""
        atomic_write_json(
            self.paths.server_file,
            {"url": url, "host": self.host, "port": self.port, "pid": os.getpid()},
            mode=0o600,
        )
        log.info("serving on %s", url)
        self.service.events.publish(ServerStarted(self.host, self.port, url))
        return url

    async def stop(self, reason: str = "stopped") -> None:
        """Close the listener first, end every stream with a final event, then clean up."""
        runner, site, app = self._runner, self._site, self._app
        if runner is None or app is None:
            return
        self._runner = self._site = self._app = None
        state = app[STATE]
        state.stopping = True
        if site is not None:
            await site.stop()  # no new connections from here on
        for gen in list(state.active):
            gen.cancel()  # each stream ends with an error event naming the shutdown
        # let every handler write its final event before connections are closed
        deadline = asyncio.get_running_loop().time() + 5.0
        while state.inflight and asyncio.get_running_loop().time() < deadline:
            for gen in list(state.active):
                gen.cancel()
            await asyncio.sleep(0.02)
        await runner.cleanup()
        with contextlib.suppress(OSError, ValueError):
            info = read_json(self.paths.server_file, {})
            if isinstance(info, dict) and info.get("pid") == os.getpid():
                self.paths.server_file.unlink()
        log.info("server stopped (%s)", reason)
        self.service.events.publish(ServerStopped(reason))


def _bind(host: str, port: int) -> socket.socket:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, _, _, _, addr = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        # SO_REUSEADDR lets a restart rebind while old connections sit in TIME_WAIT; it does not
        # let two live servers share the port on POSIX
        if os.name != "nt":
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(128)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock
