"""Whether the Hub can be reached at all, found out in a few seconds.

huggingface_hub retries a failed listing five times with backoff (~23 s here, more where name
lookups are slow) and its client has no connect timeout, so "offline" used to surface as a raw
``[Errno -2]`` after half a minute. One name lookup and one TCP connect, each bounded, say it at
once; a success is remembered briefly so a search and its size lookups probe once.
Tested by tests/core/hub/test_offline.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import socket
import time
import urllib.request
from urllib.parse import urlsplit

from app.errors import HubOffline

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 4.0  # per step (name lookup, connect): a slow network still answers in this
REACHABLE_TTL_S = 30.0  # a reachable Hub is not probed again for this long


def network_reason(exc: BaseException) -> str:
    """Why a connection failed, in words: never a raw errno (the cause chain is searched)."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, socket.gaierror):
            return "its name does not resolve"
        if isinstance(e, TimeoutError | asyncio.TimeoutError):
            return "it did not answer in time"
        if isinstance(e, OSError) and e.errno == errno.ECONNREFUSED:
            return "nothing accepts connections there"
        if isinstance(e, OSError) and e.errno in (errno.ENETUNREACH, errno.EHOSTUNREACH):
            return "there is no route to it"
        e = e.__cause__ or e.__context__
    text = str(exc)
    if "Name or service not known" in text or "nodename nor servname" in text:
        return "its name does not resolve"
    return f"the connection failed ({type(exc).__name__})"


def offline_error(host: str, reason: str) -> HubOffline:
    """The message the user reads: "You're offline" when the name cannot even be looked up."""
    if reason == "its name does not resolve":
        return HubOffline(f"You're offline: can't reach the Hub at {host} ({reason}).")
    return HubOffline(f"Can't reach the Hub at {host}: {reason}.")


def _target(endpoint: str) -> tuple[str, int, str]:
    """(host, port, what to call it) the probe connects to: the proxy when one applies."""
    parts = urlsplit(endpoint)
    scheme = parts.scheme or "https"
    host = parts.hostname or ""
    port = parts.port or (443 if scheme == "https" else 80)
    shown = host if parts.port is None else f"{host}:{port}"
    proxy = urllib.request.getproxies().get(scheme)
    if proxy and not urllib.request.proxy_bypass(host):
        p = urlsplit(proxy if "://" in proxy else f"http://{proxy}")
        if p.hostname:
            return p.hostname, p.port or 80, f"{shown} (through the proxy {p.hostname})"
    return host, port, shown


class Reachability:
    """Probes one endpoint; remembers a success for ``ttl`` seconds (failures are not kept, so
    the next try after the network returns goes through at once)."""

    def __init__(
        self, endpoint: str, *, timeout: float = CONNECT_TIMEOUT_S, ttl: float = REACHABLE_TTL_S
    ) -> None:
        self.endpoint = endpoint
        self.timeout = timeout
        self.ttl = ttl
        self._ok_until = 0.0

    async def check(self) -> None:
        """Return at once when the Hub was reachable lately; else probe.

        Raises:
            HubOffline: the name does not resolve, or no address accepts a connection in time.
        """
        if time.monotonic() < self._ok_until:
            return
        host, port, shown = _target(self.endpoint)
        loop = asyncio.get_running_loop()
        try:
            infos = await asyncio.wait_for(
                loop.getaddrinfo(host, port, type=socket.SOCK_STREAM), self.timeout
            )
        except (OSError, TimeoutError) as e:
            log.info("the Hub at %s: name lookup failed: %s", shown, e)
            raise offline_error(shown, network_reason(e)) from e
        last: BaseException | None = None
        deadline = loop.time() + self.timeout
        for family, _type, _proto, _name, addr in infos:
            left = deadline - loop.time()
            if left <= 0:
                break
            try:
                _, writer = await asyncio.wait_for(
                    asyncio.open_connection(str(addr[0]), int(addr[1]), family=family), left
                )
            except (OSError, TimeoutError) as e:
                last = e
                continue
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
            self._ok_until = time.monotonic() + self.ttl
            return
        err = last if last is not None else TimeoutError()
        log.info("the Hub at %s: connect failed: %s", shown, err)
        raise offline_error(shown, network_reason(err)) from err
