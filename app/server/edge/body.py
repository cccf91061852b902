"""Request bodies: read whole, then their Content-Encoding decoded strictly and within the limit.

Hearth's server turns aiohttp's own decompression off (see connections.py): aiohttp accepts a gzip
body cut short as if it were whole, and its errors surface as a bare exception (a 500).
Tested by tests/server/test_security.py and tests/server/test_big_inputs.py.
"""

from __future__ import annotations

import asyncio
import json
import zlib
from typing import Any

from aiohttp import web

from app.errors import HearthError, InvalidRequest
from app.server import records
from app.server.protocols.common import parse_json
from app.server.state import STATE, context_of

_GZIP_WBITS = 16 + zlib.MAX_WBITS
OFF_LOOP_BYTES = 1 << 20  # bodies larger than this are parsed on a thread (~10 ms of work)


class BodyTooLarge(HearthError):
    status = 413
    code = "request_too_large"
    type = "invalid_request_error"


class InvalidBody(InvalidRequest):
    """The body's bytes cannot be read as sent: not the encoding it claims, cut short."""

    code = "invalid_body"


class UnsupportedEncoding(HearthError):
    status = 415
    code = "unsupported_content_encoding"
    type = "invalid_request_error"


def too_large(limit: int) -> BodyTooLarge:
    return BodyTooLarge(f"The request body is larger than the limit ({limit} bytes)")


def decode_body(raw: bytes, content_encoding: str, limit: int) -> bytes:
    """Undo ``content_encoding`` (gzip, deflate or identity) on ``raw``.

    Raises:
        BodyTooLarge: the decoded body is over ``limit`` bytes (decoding stops there).
        InvalidBody: the bytes are not valid data of that encoding, or are truncated.
        UnsupportedEncoding: another encoding, or several.
    """
    codings = [c.strip().lower() for c in content_encoding.split(",")]
    codings = [c for c in codings if c and c != "identity"]
    if not codings or not raw:
        return raw
    if len(codings) > 1 or codings[0] not in ("gzip", "x-gzip", "deflate"):
        raise UnsupportedEncoding(
            f"Content-Encoding {content_encoding!r} is not supported; send gzip, deflate or none"
        )
    if codings[0] == "deflate":
        # RFC 9110 deflate is zlib-wrapped, but some clients send raw deflate (aiohttp takes both)
        wbits = zlib.MAX_WBITS if raw[0] & 0x0F == 8 else -zlib.MAX_WBITS
        return _inflate(raw, wbits, limit, "deflate")
    return _inflate(raw, _GZIP_WBITS, limit, "gzip")


def _inflate(data: bytes, wbits: int, limit: int, name: str) -> bytes:
    out = bytearray()
    while True:  # a gzip body may be several members back to back (RFC 1952)
        d = zlib.decompressobj(wbits)
        try:
            out += d.decompress(data, limit + 1 - len(out))  # never more than the limit + 1
        except zlib.error as e:
            raise InvalidBody(
                f"The request body is not valid {name} data (Content-Encoding: {name}): {e}"
            ) from e
        if len(out) > limit or d.unconsumed_tail:
            raise too_large(limit)
        if not d.eof:
            raise InvalidBody(
                f"The {name} request body is truncated: the compressed stream does not end"
            )
        data = d.unused_data
        if not data:
            return bytes(out)
        if wbits != _GZIP_WBITS:
            raise InvalidBody(f"The {name} request body has extra bytes after its end")


async def read_body(request: web.Request, limit: int) -> bytes:
    """The whole body, decoded.

    Raises:
        web.HTTPRequestEntityTooLarge: more than the app's client_max_size arrived.
        BodyTooLarge, InvalidBody, UnsupportedEncoding: see ``decode_body``.
    """
    try:
        raw = await request.read()
    except web.RequestPayloadError as e:  # e.g. broken chunked framing
        raise InvalidBody(f"The request body could not be read: {e}") from e
    if getattr(request.content, "total_compressed_bytes", None) is not None:
        return raw  # a runner with aiohttp's decompression on (tests) already decoded it
    encoding = request.headers.get("Content-Encoding", "")
    if encoding and len(raw) > OFF_LOOP_BYTES // 8:  # inflating can take a while: not here
        return await asyncio.to_thread(decode_body, raw, encoding, limit)
    return decode_body(raw, encoding, limit)


async def large_json_response(data: Any, headers: dict[str, str] | None = None) -> web.Response:
    """A JSON answer serialized off the event loop (2,048 embeddings are ~1 s of json.dumps)."""
    body = await asyncio.to_thread(json.dumps, data)
    return web.Response(text=body, content_type="application/json", headers=headers)


async def read_json_body(request: web.Request) -> dict[str, Any]:
    """The body as a JSON object (bounded; parsed off the loop when large)."""
    # any Content-Type is parsed as JSON (curl sends form-urlencoded by default); browsers'
    # no-preflight text/plain POSTs are stopped by the Origin check, not here
    raw = await read_body(request, request.app[STATE].settings.max_body_bytes)
    records.note_body(request, raw)  # kept only with records.log_content
    if len(raw) > OFF_LOOP_BYTES:  # a 32 MiB body is a few hundred ms of parsing
        body = await asyncio.to_thread(parse_json, raw)
    else:
        body = parse_json(raw)
    records.note_model(request, body)  # asked for, even if the request fails before naming it
    note_session(request, body)
    return body


def note_session(request: web.Request, body: Any) -> None:
    """The request's affinity key on its context: the ``x-session-id`` (or
    ``x-hearth-session``) header, else the body's end user (OpenAI ``user``, Anthropic
    ``metadata.user_id``). Both are sent on to remote engines, so routers behind them keep
    affinity too."""
    ctx = context_of(request)
    header = request.headers.get("x-session-id") or request.headers.get("x-hearth-session") or ""
    user: Any = None
    if isinstance(body, dict):
        user = body.get("user")
        meta = body.get("metadata")
        if not isinstance(user, str) and isinstance(meta, dict):
            user = meta.get("user_id")
    ctx.session_header = header.strip()[:256]
    ctx.user = user.strip()[:256] if isinstance(user, str) else ""
    ctx.session = ctx.session_header or ctx.user
