"""One SSE writer: framing, [DONE], error events. Disconnects surface as exceptions to the caller."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from app.errors import HearthError


def error_body(err: HearthError) -> dict[str, Any]:
    return {
        "error": {"message": err.message, "type": err.type, "param": err.param, "code": err.code}
    }


class SSEWriter:
    """Writes ``data: <json>\\n\\n`` events on a StreamResponse."""

    def __init__(self, request: web.Request, headers: dict[str, str] | None = None) -> None:
        self.request = request
        self.response = web.StreamResponse(
            status=200,
            headers={
                "Content-Type": "text/event-stream; charset=utf-8",
                "Cache-Control": "no-cache",
                "X-Accel-Buffering": "no",
                **(headers or {}),
            },
        )
        self.started = False

    async def start(self) -> None:
        await self.response.prepare(self.request)
        self.started = True

    async def send(self, obj: Any) -> None:
        await self.response.write(
            b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"
        )

    async def send_error(self, err: HearthError) -> None:
        """The one error event a broken stream gets; it never ends with [DONE] after this."""
        await self.send(error_body(err))

    async def done(self) -> None:
        await self.response.write(b"data: [DONE]\n\n")

    async def close(self) -> web.StreamResponse:
        await self.response.write_eof()
        return self.response
