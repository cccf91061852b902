"""Fetching image URLs, bounded and only from public addresses (SSRF).

Each hop (the URL, then every redirect) is resolved here, every address is checked, and the
connection goes to the checked address through a pinned resolver: aiohttp never looks the
name up again, so a name that answers a public address to the check and 127.0.0.1 to the
connect (DNS rebinding) is not followed.
Tested by tests/server/edge/test_vision.py.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urljoin, urlsplit

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult

from app.core.inference.images import InvalidImage

log = logging.getLogger(__name__)

Resolve = Callable[[str, int], Awaitable[list[str]]]  # (host, port) -> IP addresses
REDIRECTS = (301, 302, 303, 307, 308)
CHUNK = 64 * 1024


async def system_resolve(host: str, port: int) -> list[str]:
    """The system resolver's addresses for ``host`` (the default)."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


_NAT64 = ipaddress.ip_network("64:ff9b::/96")


def public_address(address: str) -> bool:
    """Whether an IP address is a public unicast one (not loopback, private, link-local,
    multicast, unspecified, reserved or shared)."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address):
        # an IPv4 address inside IPv6 (mapped, 6to4, NAT64) is judged as that IPv4 address
        if ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        elif ip.sixtofour is not None:
            ip = ip.sixtofour
        elif ip in _NAT64:
            ip = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return ip.is_global and not (
        ip.is_multicast or ip.is_loopback or ip.is_link_local or ip.is_private or ip.is_reserved
    )


class _PinnedResolver(AbstractResolver):
    """Answers the one host with the addresses already checked; anything else is refused."""

    def __init__(self, host: str, addresses: list[tuple[str, int]]) -> None:
        self.host, self.addresses = host, addresses

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        if host != self.host:
            raise OSError(f"no address was checked for {host}")
        return [
            ResolveResult(
                hostname=host,
                host=addr,
                port=p,
                family=socket.AF_INET6 if ":" in addr else socket.AF_INET,
                proto=0,
                flags=socket.AI_NUMERICHOST,
            )
            for addr, p in self.addresses
        ]

    async def close(self) -> None:
        return None


@dataclass
class ImageFetcher:
    """GETs an image URL: at most ``max_redirects`` redirects, ``timeout_s`` in all, the body
    read incrementally up to the byte cap; every hop's addresses must be public.

    ``resolve`` and ``dial`` are the seams: ``resolve`` replaces the system resolver (tests
    map a public-looking name to an address); ``dial`` maps a checked ``(address, port)`` to
    where the connection really goes (tests: a local server). Neither skips the check.
    """

    resolve: Resolve = system_resolve
    dial: Mapping[tuple[str, int], tuple[str, int]] = field(default_factory=dict)
    max_redirects: int = 3
    timeout_s: float = 10.0

    async def fetch(self, url: str, *, where: str, max_bytes: int) -> bytes:
        """The body of ``url``.

        Raises:
            InvalidImage: a refused address, too many redirects, too many bytes, a timeout, an
                HTTP error or a network failure (``param`` is ``where``).
        """
        try:
            async with asyncio.timeout(self.timeout_s):
                return await self._follow(url, where, max_bytes)
        except TimeoutError:
            raise InvalidImage(
                f"fetching the image took longer than {self.timeout_s:g} s", param=where
            ) from None
        except aiohttp.ClientError as e:
            raise InvalidImage(f"fetching the image failed: {e}", param=where) from None

    async def _follow(self, url: str, where: str, max_bytes: int) -> bytes:
        for _ in range(self.max_redirects + 1):
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise InvalidImage("an image URL must be http(s) with a host", param=where)
            host = parts.hostname
            port = parts.port or (443 if parts.scheme == "https" else 80)
            targets = await self._checked(host, port, where)
            connector = aiohttp.TCPConnector(resolver=_PinnedResolver(host, targets))
            async with (
                aiohttp.ClientSession(connector=connector, trust_env=False) as session,
                session.get(url, allow_redirects=False) as resp,
            ):
                if resp.status in REDIRECTS and resp.headers.get("Location"):
                    url = urljoin(url, resp.headers["Location"])
                    continue
                if resp.status != 200:
                    raise InvalidImage(
                        f"fetching the image answered HTTP {resp.status}", param=where
                    )
                return await _read_capped(resp, where, max_bytes)
        raise InvalidImage(
            f"the image URL redirects more than {self.max_redirects} times", param=where
        )

    async def _checked(self, host: str, port: int, where: str) -> list[tuple[str, int]]:
        try:
            ipaddress.ip_address(host)
            addresses = [host]
        except ValueError:
            try:
                addresses = await self.resolve(host, port)
            except OSError as e:
                raise InvalidImage(
                    f"the image host {host} does not resolve: {e}", param=where
                ) from None
        if not addresses:
            raise InvalidImage(f"the image host {host} has no address", param=where)
        refused = [a for a in addresses if not public_address(a)]
        if refused:
            log.info("image URL refused: %s resolves to %s", host, refused[0])
            raise InvalidImage(
                f"the image URL's host {host} is a loopback, private, link-local or other "
                "non-public address; such URLs are never fetched",
                param=where,
            )
        return [self.dial.get((a, port), (a, port)) for a in addresses]


async def _read_capped(resp: Any, where: str, max_bytes: int) -> bytes:
    declared = resp.content_length
    if declared is not None and declared > max_bytes:
        raise InvalidImage(
            f"the image is {declared} bytes; at most {max_bytes} are taken", param=where
        )
    out = bytearray()
    async for chunk in resp.content.iter_chunked(CHUNK):
        out += chunk
        if len(out) > max_bytes:
            raise InvalidImage(f"the image is over {max_bytes} bytes", param=where)
    return bytes(out)
