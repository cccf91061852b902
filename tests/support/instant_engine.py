"""An OpenAI-compatible engine that answers at once: GET /v1/models, POST /v1/chat/completions
with a fixed 1-token answer (whole, or streamed as SSE when the body asks ``"stream": true``),
HTTP/1.1 keep-alive, raw asyncio (no framework), so what a benchmark measures in front of it is
the gateway, not the engine. GET /stats answers how many TCP connections it accepted and how
many chats it answered (a test checks connection reuse with it).

Run:  python -m tests.support.instant_engine [--port 0]   (prints its base URL, then serves)
Used by tests/bench/gateway_overhead.py and tests/e2e/providers/test_remote_connections.py.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

MODEL = "instant"
MAX_HEAD = 64 * 1024

_MODELS = json.dumps(
    {"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "bench"}]}
).encode()
_USAGE = {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}
_WHOLE = json.dumps(
    {
        "id": "chatcmpl-instant",
        "object": "chat.completion",
        "created": 1,
        "model": MODEL,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Hi"},
                "finish_reason": "length",
            }
        ],
        "usage": _USAGE,
    }
).encode()


def _chunk(delta: dict[str, Any], finish: str | None, usage: bool = False) -> bytes:
    obj: dict[str, Any] = {
        "id": "chatcmpl-instant",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": MODEL,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    if usage:
        obj["usage"] = _USAGE
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


_STREAM = (
    _chunk({"role": "assistant", "content": ""}, None)
    + _chunk({"content": "Hi"}, None)
    + _chunk({}, "length", usage=True)
    + b"data: [DONE]\n\n"
)


def _response(status: str, ctype: bytes, body: bytes) -> bytes:
    return (
        b"HTTP/1.1 " + status.encode() + b"\r\nContent-Type: " + ctype
        + b"\r\nContent-Length: " + str(len(body)).encode()
        + b"\r\nConnection: keep-alive\r\n\r\n" + body
    )  # fmt: skip


class Stats:
    def __init__(self) -> None:
        self.connections = 0
        self.chats = 0


class _Conn(asyncio.Protocol):
    def __init__(self, stats: Stats) -> None:
        self.stats = stats
        self.buf = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.stats.connections += 1

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while self.transport is not None:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                if len(self.buf) > MAX_HEAD:
                    self.transport.close()
                return
            head = self.buf[:end].decode("latin-1")
            length = 0
            for line in head.split("\r\n")[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value.strip())
            if len(self.buf) < end + 4 + length:
                return
            body = self.buf[end + 4 : end + 4 + length]
            self.buf = self.buf[end + 4 + length :]
            self.transport.write(self._answer(head.split(" ", 2), body))

    def _answer(self, line: list[str], body: bytes) -> bytes:
        method, path = line[0], line[1] if len(line) > 1 else "/"
        if method == "GET" and path == "/v1/models":
            return _response("200 OK", b"application/json", _MODELS)
        if method == "GET" and path == "/stats":
            doc = {"connections": self.stats.connections, "chats": self.stats.chats}
            return _response("200 OK", b"application/json", json.dumps(doc).encode())
        if method == "POST" and path == "/v1/chat/completions":
            self.stats.chats += 1
            try:
                streamed = bool(json.loads(body).get("stream"))
            except (ValueError, AttributeError):
                return _response("400 Bad Request", b"application/json", b'{"error":"bad body"}')
            if streamed:
                return _response("200 OK", b"text/event-stream", _STREAM)
            return _response("200 OK", b"application/json", _WHOLE)
        return _response("404 Not Found", b"application/json", b'{"error":"not found"}')


async def serve(host: str = "127.0.0.1", port: int = 0) -> tuple[asyncio.Server, str, Stats]:
    """A listening engine on this loop: (server, base URL ending in /v1, its counters)."""
    stats = Stats()
    server = await asyncio.get_running_loop().create_server(lambda: _Conn(stats), host, port)
    bound = server.sockets[0].getsockname()[1]
    return server, f"http://{host}:{bound}/v1", stats


async def _main(port: int) -> None:
    server, url, _ = await serve(port=port)
    print(url, flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="an OpenAI-compatible engine that answers at once")
    ap.add_argument("--port", type=int, default=0)
    try:
        asyncio.run(_main(ap.parse_args().port))
    except KeyboardInterrupt:
        sys.exit(0)
