"""OpenAI's speech-to-text routes: /v1/audio/transcriptions and /v1/audio/translations.
The form is read within its bounds at the edge (edge/audio.py), the adapter makes the request
(protocols/openai/audio.py), and the service runs it through the one pipeline (keys, rate
limits, the gateway, the scheduler); the answer is whole, or streamed as SSE events.
Tested by tests/server/audio/test_transcriptions.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from aiohttp import web

from app.core.requests import Transcription
from app.core.types import TranscriptSegment
from app.errors import GenerationTimeout, HearthError
from app.server.edge.audio import read_form
from app.server.protocols import OPENAI
from app.server.protocols.base import Frame
from app.server.protocols.openai import audio as wire
from app.server.routes import ProtocolRoutes
from app.server.state import REQUEST_LOG, SERVICE, with_context
from app.server.streaming import FrameWriter, request_deadline

routes = ProtocolRoutes(OPENAI)


@routes.post("/v1/audio/transcriptions")
async def transcriptions(request: web.Request) -> web.StreamResponse:
    return await _speech(request, "transcribe")


@routes.post("/v1/audio/translations")
async def translations(request: web.Request) -> web.StreamResponse:
    return await _speech(request, "translate")


async def _speech(request: web.Request, task: str) -> web.StreamResponse:
    fields, audio = await read_form(request)
    parsed = wire.parse(fields, audio, task=task)
    req = with_context(request, parsed.request)
    request[REQUEST_LOG]["model"] = req.model
    result = await request.app[SERVICE].transcribe(req)
    request[REQUEST_LOG]["answered_by"] = result.model
    headers = {"x-hearth-model": result.model, "x-hearth-route": ",".join(result.route)}
    if parsed.stream:
        return await _stream(request, result, headers)
    segments = [s async for s in _timed(request, result)]
    t = result.transcript
    body, content_type = wire.render(parsed, segments, t.language, t.duration)
    return web.Response(text=body, content_type=content_type, headers=headers)


async def _timed(request: web.Request, result: Transcription) -> AsyncIterator[TranscriptSegment]:
    """The segments until the request's deadline (the model stops at it)."""
    try:
        async with asyncio.timeout_at(request_deadline(request)):
            async for segment in result.transcript:
                yield segment
    except TimeoutError:
        result.transcript.cancel()
        raise GenerationTimeout("the transcription ran over the server's time limit") from None


async def _stream(
    request: web.Request, result: Transcription, headers: dict[str, str]
) -> web.StreamResponse:
    writer = FrameWriter(request, "sse", headers)
    await writer.start()
    events = wire.TextStream()
    try:
        async for segment in _timed(request, result):
            event = events.delta(segment)
            if event is not None:
                await writer.write([Frame(event)])
    except HearthError as e:  # after the headers: the error is the stream's last event
        await writer.write([Frame(OPENAI.error_body(e), event="error")])
        return await writer.close()
    await writer.write([Frame(events.done())])
    return await writer.close()
