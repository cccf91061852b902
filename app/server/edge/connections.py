"""The connection edge: deadlines and caps for clients that have not finished sending a request
(SECURITY.md 6).

aiohttp reads headers and bodies without a deadline (its keep-alive timer closes a connection
only when it is idle between requests, after an hour), so a client that dribbles bytes holds a
connection and its buffers for as long as it likes. Here each connection knows its phase:

  fresh    connected, nothing sent yet         closed header_timeout_s after connecting
  headers  part of a request line or headers   closed header_timeout_s after its first byte
  body     headers in, body still arriving     closed body_timeout_s after the headers, plus
                                               one second per body_min_rate bytes received
  idle     between requests, or being answered no deadline here (aiohttp's keep-alive applies)

Only ``headers`` and ``body`` connections count toward the caps, so a client that sends whole
requests is never refused, however many connections it keeps open or streams it reads.
"""

from __future__ import annotations

import asyncio
import enum
import ipaddress
import json
import logging
import socket
import ssl
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from aiohttp.streams import StreamReader
from aiohttp.web_protocol import RequestHandler

from app.settings import ServerSettings

log = logging.getLogger(__name__)

# aiohttp's own decompression is off: app/server/edge/body.py decodes bodies strictly
HANDLER_OPTIONS: dict[str, Any] = {"access_log": None, "auto_decompress": False}


@dataclass(frozen=True, slots=True)
class EdgeLimits:
    header_timeout_s: float = 20.0
    body_timeout_s: float = 30.0
    body_min_rate: int = 16 * 1024  # bytes per second that extend the body deadline; 0 = none
    max_incomplete: int = 512
    max_incomplete_per_client: int = 64

    @classmethod
    def from_settings(cls, s: ServerSettings) -> EdgeLimits:
        return cls(
            header_timeout_s=s.header_timeout_s,
            body_timeout_s=s.body_timeout_s,
            body_min_rate=s.body_min_rate,
            max_incomplete=s.max_incomplete_connections,
            max_incomplete_per_client=s.max_incomplete_per_client,
        )


def client_key(peer: Any) -> str:
    """What a per-client cap counts: the peer's IP (IPv4-mapped ones as IPv4), IPv6 by /64
    (one host usually holds a whole /64)."""
    host = peer[0] if isinstance(peer, tuple) and peer else str(peer)
    try:
        ip = ipaddress.ip_address(str(host).split("%", 1)[0])
    except ValueError:
        return str(host)
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        if not ip.is_loopback:
            return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


class IncompleteConnections:
    """Counts the connections still sending a request, in all and per client."""

    def __init__(self, limits: EdgeLimits) -> None:
        self.limits = limits
        self.total = 0
        self.by_client: dict[str, int] = {}

    def admit(self, client: str) -> bool:
        n = self.by_client.get(client, 0)
        if self.total >= self.limits.max_incomplete or n >= self.limits.max_incomplete_per_client:
            return False
        self.total += 1
        self.by_client[client] = n + 1
        return True

    def release(self, client: str) -> None:
        self.total -= 1
        n = self.by_client.pop(client) - 1
        if n:
            self.by_client[client] = n


class Phase(enum.Enum):
    FRESH = "fresh"
    HEADERS = "headers"
    BODY = "body"
    IDLE = "idle"


def _received(payload: StreamReader) -> bool:
    return payload.is_eof() or payload.exception() is not None


def _error_response(status: int, reason: str, message: str, code: str) -> bytes:
    body = json.dumps(
        {
            "error": {
                "message": message,
                "type": "invalid_request_error",
                "param": None,
                "code": code,
            }
        }
    ).encode()
    retry = "Retry-After: 1\r\n" if status == 503 else ""
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n{retry}Connection: close\r\n\r\n"
    )
    return head.encode() + body


_HEADER_TIMEOUT = _error_response(
    408, "Request Timeout", "The request headers did not arrive in time.", "request_timeout"
)
_REFUSED = _error_response(
    503,
    "Service Unavailable",
    "Too many connections from this address are still sending their request.",
    "too_many_incomplete_connections",
)


class GuardedRequestHandler(RequestHandler):
    """aiohttp's protocol, with this module's deadlines and caps on the phases before a request
    is whole. Everything after (handlers, streaming, keep-alive) is aiohttp's own."""

    __slots__ = ("_edge", "_client", "_phase", "_counted", "_timer", "_since", "_body")

    def __init__(self, manager: web.Server, edge: IncompleteConnections, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._edge = edge
        self._client = ""
        self._phase = Phase.FRESH
        self._counted = False
        self._timer: asyncio.TimerHandle | None = None
        self._since = 0.0
        self._body: StreamReader | None = None

    @property
    def phase(self) -> Phase:
        return self._phase

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._client = client_key(transport.get_extra_info("peername"))
        self._since = self._loop.time()
        self._arm(self._since + self._edge.limits.header_timeout_s)

    def connection_lost(self, exc: BaseException | None) -> None:
        self._to_idle()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._force_close or self._close or self._upgraded or self._payload_parser is not None:
            self._to_idle()  # closing, or no longer HTTP/1 requests: nothing to time
            super().data_received(data)
            return
        before = self._request_count
        super().data_received(data)
        if self.transport is None or self._force_close:
            return
        # A request that ends inside this read may be followed by the start of the next one;
        # those bytes are timed from the next read (until then the connection costs what an
        # idle keep-alive one does, which aiohttp's keep-alive timer already bounds)
        if self._request_count != before and self._messages:
            payload = self._messages[-1][1]  # the newest request; earlier ones are whole
            if _received(payload):
                self._to_idle()
            else:
                self._enter_body(payload)
        elif self._phase is Phase.BODY:
            if self._body is None or _received(self._body):
                self._to_idle()
        elif self._phase in (Phase.FRESH, Phase.IDLE) and data.strip(b"\r\n"):
            self._enter_headers()  # llhttp skips CRLFs between requests: those start nothing

    # -- phases ------------------------------------------------------------------------------
    def _enter_headers(self) -> None:
        if not self._admit(_REFUSED):
            return
        if self._phase is Phase.IDLE:  # a fresh connection's deadline already runs from connect
            self._since = self._loop.time()
            self._arm(self._since + self._edge.limits.header_timeout_s)
        self._phase = Phase.HEADERS

    def _enter_body(self, payload: StreamReader) -> None:
        if not self._admit(_REFUSED):
            return
        self._phase, self._body = Phase.BODY, payload
        self._since = self._loop.time()
        self._arm(self._since + self._edge.limits.body_timeout_s)

    def _to_idle(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._counted:
            self._counted = False
            self._edge.release(self._client)
        self._phase, self._body = Phase.IDLE, None

    def _admit(self, refusal: bytes) -> bool:
        if self._counted:
            return True
        if self._edge.admit(self._client):
            self._counted = True
            return True
        self._shut(refusal, "over the cap on connections still sending a request")
        return False

    # -- deadlines ---------------------------------------------------------------------------
    def _arm(self, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._loop.call_at(when, self._on_deadline)

    def _on_deadline(self) -> None:
        self._timer = None
        if self.transport is None:
            return
        limits = self._edge.limits
        if self._phase is Phase.BODY and self._body is not None:
            rate = limits.body_min_rate
            # bytes as sent: aiohttp's decompression is off (HANDLER_OPTIONS)
            extra = self._body.total_bytes / rate if rate else 0.0
            due = self._since + limits.body_timeout_s + extra
            if self._loop.time() < due:  # bytes came in at the minimum rate: more time
                self._arm(due)
                return
            self._shut(None, f"its body did not arrive within {limits.body_timeout_s:g} s")
        elif self._phase is Phase.HEADERS:
            self._shut(_HEADER_TIMEOUT, f"no whole headers within {limits.header_timeout_s:g} s")
        elif self._phase is Phase.FRESH:
            self._shut(None, f"no request within {limits.header_timeout_s:g} s of connecting")

    def _shut(self, response: bytes | None, why: str) -> None:
        log.debug("closing a connection from %s: %s", self._client, why)
        # a handler still answering an earlier request owns the stream: no bytes of ours then
        if response is not None and not self._request_in_progress and self.transport is not None:
            self.transport.write(response)
        self._to_idle()
        self.force_close()


class GuardedSite(web.BaseSite):
    """A listening socket whose connections are ``GuardedRequestHandler`` s."""

    __slots__ = ("_sock", "_edge", "_name")

    def __init__(
        self,
        runner: web.BaseRunner,
        sock: socket.socket,
        edge: IncompleteConnections,
        *,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        super().__init__(runner, backlog=128, ssl_context=ssl_context)
        self._sock = sock
        self._edge = edge
        host, port = sock.getsockname()[:2]
        scheme = "https" if ssl_context else "http"
        self._name = f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}"

    @property
    def name(self) -> str:
        return self._name

    async def start(self) -> None:
        await super().start()
        loop = asyncio.get_running_loop()
        server = self._runner.server
        if server is None:
            raise RuntimeError("the runner is not set up")
        edge = self._edge

        def protocol() -> GuardedRequestHandler:
            return GuardedRequestHandler(server, edge, loop=loop, **HANDLER_OPTIONS)

        # a TLS handshake happens before the protocol sees the connection: it gets the header
        # deadline of its own (a client that never finishes one holds nothing past it)
        tls: dict[str, Any] = {}
        if self._ssl_context is not None:
            tls = {"ssl": self._ssl_context, "ssl_handshake_timeout": edge.limits.header_timeout_s}
        self._server = await loop.create_server(
            protocol, sock=self._sock, backlog=self._backlog, **tls
        )
