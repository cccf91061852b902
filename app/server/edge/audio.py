"""Audio uploads: a multipart/form-data body read part by part, the file within
``audio.max_bytes`` and every other field within a few kilobytes, so no upload is held in
memory past its bound (aiohttp's own body limit applies to whole-body reads only).
Tested by tests/server/audio/test_hostile_audio.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import BodyPartReader, web

from app.core.types import AudioInput
from app.errors import InvalidRequest
from app.server import records
from app.settings import AudioSettings

FIELD_BYTES = 64 * 1024  # a form field besides the file (a prompt is 224 tokens at most)
MAX_FIELDS = 64  # parts in one form
CHUNK = 64 * 1024


class AudioTooLarge(InvalidRequest):
    code = "audio_too_large"


@dataclass
class AudioEdge:
    """What the server needs for audio uploads: the settings, read per request."""

    settings: Callable[[], AudioSettings] = AudioSettings


AUDIO = web.AppKey("audio", AudioEdge)


def _too_large(limit: int) -> AudioTooLarge:
    return AudioTooLarge(
        f"the audio file is larger than the limit of {limit} bytes (the server's "
        "audio.max_bytes setting)",
        param="file",
    )


async def read_form(request: web.Request) -> tuple[dict[str, list[str]], AudioInput]:
    """The request's form, each part bounded as it streams in: its text fields (a name may
    repeat: ``include[]``) and the audio file.

    Raises:
        InvalidRequest: not multipart/form-data, a malformed form, no ``file`` part, a field
            over its bound; AudioTooLarge: the file over ``audio.max_bytes`` (param ``file``).
    """
    cfg = request.app[AUDIO].settings()
    ctype = request.content_type
    if ctype != "multipart/form-data":
        raise InvalidRequest(
            f"send the audio as multipart/form-data with a 'file' part (got {ctype or 'none'})",
            param="file",
        )
    encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):  # audio is compressed already
        raise InvalidRequest(
            f"Content-Encoding {encoding!r} is not taken for audio uploads; send the form as is",
            param="file",
        )
    # a declared length over the bound is refused before a byte of it is read
    declared = request.content_length
    if declared is not None and declared > cfg.max_bytes + MAX_FIELDS * FIELD_BYTES:
        raise _too_large(cfg.max_bytes)
    fields: dict[str, list[str]] = {}
    audio: AudioInput | None = None
    try:
        reader = await request.multipart()
        parts = 0
        while (part := await reader.next()) is not None:
            parts += 1
            if parts > MAX_FIELDS:
                raise InvalidRequest(f"the form has more than {MAX_FIELDS} parts", param="file")
            if not isinstance(part, BodyPartReader):  # a nested multipart: not a form field
                raise InvalidRequest("the form holds a nested multipart part", param="file")
            name = part.name or ""
            if name == "file":
                data = await _read_part(part, cfg.max_bytes, _too_large(cfg.max_bytes))
                audio = AudioInput(bytes(data), part.filename or "", cfg.max_seconds)
                continue
            raw = await _read_part(
                part,
                FIELD_BYTES,
                InvalidRequest(f"the form field '{name}' is over {FIELD_BYTES} bytes", param=name),
            )
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise InvalidRequest(f"the form field '{name}' is not UTF-8", param=name) from None
            fields.setdefault(name, []).append(text)
    except (ValueError, AssertionError, web.HTTPException) as e:  # aiohttp's malformed forms
        raise InvalidRequest(f"the multipart form is malformed: {e}", param="file") from None
    if audio is None:
        raise InvalidRequest("the form has no 'file' part: send the audio as 'file'", param="file")
    records.note_model(request, {k: v[-1] for k, v in fields.items() if k == "model"})
    return fields, audio


async def _read_part(part: BodyPartReader, limit: int, over: InvalidRequest) -> bytearray:
    out = bytearray()
    while chunk := await part.read_chunk(CHUNK):
        out += chunk
        if len(out) > limit:  # the rest is never read
            raise over
    return out
