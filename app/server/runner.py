"""ServerController: starts and stops the aiohttp server on the service loop.
Tested by tests/server/test_security.py and tests/server/routes/test_health.py."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import ipaddress
import logging
import os
import socket
import time
from collections.abc import Callable
from typing import Any

from aiohttp import web

from app.core.events import ServerStarted, ServerStopped
from app.core.gateway.keys import KeyStore
from app.core.gateway.ratelimit import Clock
from app.core.gateway.records import RecordStore
from app.core.service import Hearth
from app.core.util.fsutil import atomic_write_json, read_json
from app.errors import ServerError
from app.paths import AppPaths
from app.server.app import STATE, create_app
from app.server.edge.audio import AudioEdge
from app.server.edge.connections import EdgeLimits, GuardedSite, IncompleteConnections
from app.server.edge.tls import TlsConfig, load_tls, tls_pair
from app.server.edge.vision import VisionEdge
from app.server.keyguard import KeyGuard
from app.server.records import RECORDER, Recorder
from app.settings import ServerSettings, SettingsStore, hash_key

log = logging.getLogger(__name__)

# socket.getaddrinfo's shape: (host, port, family, type, proto, flags) -> [(family, ..., addr)]
Resolver = Callable[..., list[tuple[Any, ...]]]


def _ip(address: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])  # drop an IPv6 zone (fe80::1%eth0)
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def is_loopback_address(address: str) -> bool:
    """Whether a bound socket address only takes connections from this machine. A wildcard
    (0.0.0.0, ::) is not loopback; neither is anything that is not an IP address."""
    ip = _ip(address)
    return ip is not None and ip.is_loopback


def base_url(address: str, port: int, scheme: str = "http") -> str:
    """The URL a client on this machine reaches a server bound to ``address`` with: that
    address itself (not the name it was given, which may resolve elsewhere for the client), or
    loopback for a wildcard bind."""
    ip = _ip(address)
    if ip is None:
        shown = address
    elif ip.is_unspecified:
        shown = "127.0.0.1" if ip.version == 4 else "[::1]"
    else:
        shown = f"[{ip}]" if ip.version == 6 else str(ip)
    return f"{scheme}://{shown}:{port}/v1"


def planned_url(server: ServerSettings) -> str:
    """Where a server started with these settings will answer (``http(s)://HOST:PORT/v1``):
    what the app and ``hearth connect`` show while it is stopped."""
    return base_url(server.host, server.port, "https" if server.tls_cert else "http")


class ServerController:
    """Owns one aiohttp runner. Call its coroutines on the service loop."""

    def __init__(
        self,
        service: Hearth,
        settings_store: SettingsStore,
        paths: AppPaths,
        *,
        resolve: Resolver = socket.getaddrinfo,
    ) -> None:
        self.service = service
        self.settings_store = settings_store
        self.paths = paths
        self.resolve = resolve  # a seam: tests map names without editing /etc/hosts
        self._runner: web.AppRunner | None = None
        self._site: web.BaseSite | None = None
        self._app: web.Application | None = None
        self.host: str | None = None  # as asked for (a name or an address)
        self.port: int | None = None
        self.addresses: tuple[str, ...] = ()  # the addresses actually bound
        self.extra_key_hashes: tuple[str, ...] = ()
        self.tls: TlsConfig | None = None  # while serving HTTPS
        self.clock: Clock = time.monotonic  # the rate limits' clock (a seam: tests freeze it)
        self._shared_keys: Any = None  # the shared keys' poll, while serving with shared state

    @property
    def running(self) -> bool:
        return self._runner is not None

    @property
    def base_url(self) -> str | None:
        if not (self.running and self.addresses and self.port):
            return None
        return base_url(self.addresses[0], self.port, "https" if self.tls else "http")

    def set_api_key(self, key: str | None) -> None:
        """A key given on the command line or in HEARTH_API_KEY (kept only as a hash)."""
        self.extra_key_hashes = (hash_key(key),) if key else ()

    async def start(
        self,
        host: str | None = None,
        port: int | None = None,
        *,
        tls_cert: str | None = None,
        tls_key: str | None = None,
        starting: bool = False,
    ) -> str:
        """Bind and serve. Returns the base URL (``https://`` with a certificate and key).

        Whether an API key is needed is decided from the address the socket is bound to, not
        from the name asked for: ``127.evil.example`` may well resolve to 0.0.0.0.

        Args:
            tls_cert, tls_key: PEM files that override ``server.tls_cert``/``server.tls_key``.
            starting: startup steps follow (preloads): /health says ``starting`` until
                :meth:`startup_done`.

        Raises:
            ServerError: the port is busy, the address is invalid, an address other than
                loopback lacks an API key, or the TLS files cannot be used.
        """
        try:
            return await self._start(host, port, tls_cert, tls_key, starting)
        except BaseException:
            if not self.running:
                await self._close_shared()  # never served: nothing else will close it
            raise

    async def _start(
        self,
        host: str | None,
        port: int | None,
        tls_cert: str | None,
        tls_key: str | None,
        starting: bool,
    ) -> str:
        if self.running:
            return self.base_url or ""
        settings = self.settings_store.load().server
        host = host or settings.host
        port = settings.port if port is None else port
        keys = tuple(settings.api_key_hashes) + self.extra_key_hashes
        store = self.settings_store

        def limits() -> tuple[int, int]:
            g = store.load().limits
            return g.rpm, g.tpm

        guard = await self._guard(keys, limits)
        pair = tls_pair(tls_cert or settings.tls_cert, tls_key or settings.tls_key)
        tls = load_tls(*pair) if pair else None  # before binding: a bad pair never listens
        try:
            sock = _bind(host, port, self.resolve)
        except OSError as e:
            raise _listen_error(e, host, port) from e
        addresses = (str(sock.getsockname()[0]),)
        exposed = [a for a in addresses if not is_loopback_address(a)]
        if exposed and not guard.required():
            sock.close()  # never listened: nobody could connect meanwhile
            where = host if exposed[0] == host else f"{host} ({exposed[0]})"
            raise ServerError(
                f"Refusing to listen on {where} without an API key: anyone on the network could use "
                f"your models. Set an API key (Settings, --api-key or HEARTH_API_KEY) or bind 127.0.0.1."
            )
        try:
            sock.listen(128)
        except OSError as e:
            sock.close()
            raise _listen_error(e, host, port) from e
        app = create_app(
            self.service,
            settings,
            api_key_hashes=keys,
            bound_host=host,
            bound_addresses=addresses,
            guard=guard,
            vision=VisionEdge(settings=lambda: store.load().vision),
            audio=AudioEdge(settings=lambda: store.load().audio),
        )
        app[STATE].starting = starting
        app[RECORDER] = recorder = self._recorder()
        # handler_cancellation: a client that disconnects cancels its handler, which cancels
        # the generation within one token
        # the connections themselves are GuardedSite's (edge/connections.py: deadlines, caps)
        runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=5.0)
        try:
            await runner.setup()
            edge = IncompleteConnections(EdgeLimits.from_settings(settings))
            site = GuardedSite(runner, sock, edge, ssl_context=tls.context if tls else None)
            await site.start()
        except BaseException:
            sock.close()
            await runner.cleanup()
            await asyncio.to_thread(recorder.store.close)
            raise
        self._runner, self._site, self._app = runner, site, app
        self.host, self.port, self.addresses = host, sock.getsockname()[1], addresses
        self.tls = tls
        url = self.base_url or ""
        record: dict[str, Any] = {"url": url, "host": self.host, "port": self.port}
        record["pid"] = os.getpid()
        if tls is not None:  # the CLI trusts exactly this certificate (app/cli/common.py)
            record["tls_cert_pem"] = tls.cert_pem
            record["tls_cert_file"] = tls.cert_file
        atomic_write_json(self.paths.server_file, record, mode=0o600)
        log.info("serving on %s", url)
        self.service.events.publish(ServerStarted(self.host, self.port, url))
        return url

    async def _guard(
        self, keys: tuple[str, ...], limits: Callable[[], tuple[int, int]]
    ) -> KeyGuard:
        """The named keys and buckets: in process, or in the shared state when it is on
        (started here: a Redis that is down now only starts the server degraded)."""
        shared = self.service.shared
        if shared is None:
            return KeyGuard(KeyStore(self.paths.keys_file), keys, limits, clock=self.clock)
        from app.redis_state.keys import SharedKeyStore
        from app.redis_state.limits import RedisBuckets

        await shared.start()
        log.info("sharing limits and keys through %s (%s)", shared.shown, shared.status()["state"])
        self._shared_keys = store = SharedKeyStore(shared, self.paths.keys_file)
        await store.start()
        return KeyGuard(
            store,
            keys,
            limits,
            clock=self.clock,
            shared=RedisBuckets(shared),
            on_failure=lambda: self.settings_store.load().state.limits_on_failure,
        )

    async def _close_shared(self) -> None:
        if self._shared_keys is not None:
            await self._shared_keys.close()
            self._shared_keys = None
        if self.service.shared is not None:
            await self.service.shared.close()

    def startup_done(self, error: str | None = None) -> None:
        """The startup steps are over: /health says ``ready``, or ``error`` (503) with the
        message of the step that failed."""
        if self._app is not None:
            state = self._app[STATE]
            state.starting, state.startup_error = False, error

    def _recorder(self) -> Recorder:
        """The request records' store, with the ``records`` settings as of now."""
        cfg = self.settings_store.load().records
        store = RecordStore(self.paths.requests_db, max_rows=cfg.max_rows)
        return Recorder(store, cfg.log_content, cfg.content_max_chars)

    async def stop(self, reason: str = "stopped") -> None:
        """Close the listener first, end every stream with a final event, then clean up."""
        runner, site, app = self._runner, self._site, self._app
        if runner is None or app is None:
            return
        self._runner = self._site = self._app = None
        self.tls = None
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
        await asyncio.to_thread(app[RECORDER].store.close)  # what is queued is written first
        await self._close_shared()  # after the cleanup's last flush of the keys' last use
        with contextlib.suppress(OSError, ValueError):
            info = read_json(self.paths.server_file, {})
            if isinstance(info, dict) and info.get("pid") == os.getpid():
                self.paths.server_file.unlink()
        log.info("server stopped (%s)", reason)
        self.service.events.publish(ServerStopped(reason))


def _listen_error(e: OSError, host: str, port: int) -> ServerError:
    if e.errno == errno.EADDRINUSE:
        return ServerError(
            f"Port {port} on {host} is already in use. Stop the other program or pick another port."
        )
    return ServerError(f"Cannot listen on {host}:{port}: {e.strerror or e}")


def _bind(host: str, port: int, resolve: Resolver) -> socket.socket:
    """A socket bound (not yet listening) to the first address ``host`` resolves to."""
    infos = resolve(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    if not infos:
        raise OSError(errno.EADDRNOTAVAIL, f"{host} resolves to no address")
    family, _, _, _, addr = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        # SO_REUSEADDR lets a restart rebind while old connections sit in TIME_WAIT; it does not
        # let two live servers share the port on POSIX
        if os.name != "nt":
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock
