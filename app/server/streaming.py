"""What every generation route shares: the request's time limit, shutdown, and how a
generation that did not finish normally is reported (one place for all four protocols).

The time limit (``server.request_timeout_s``) runs from the moment the request arrived and
covers the whole request: every generation it starts (``n`` choices, a list of prompts) and
the wait for the model. At the deadline the generations are cancelled, which stops them within
one token (or aborts their prompt); the stream then ends with an error final delta, which each
protocol writes as its own error event or error body.
Tested by tests/server/test_client_gone.py and tests/server/clients/test_tools.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import replace
from typing import Any

from aiohttp import web

from app.core.inference.generation import Choices, Completion, Generation
from app.core.types import Delta
from app.errors import GenerationTimeout, HearthError, ModelUnloaded
from app.server import records, telemetry
from app.server.protocols.base import Frame, Framing, StreamRenderer
from app.server.state import REQUEST_LOG, STATE

DEADLINE = web.RequestKey("hearth_deadline", float)  # loop time the request must end by
TIMED_OUT = web.RequestKey("hearth_timed_out", bool)


class StreamBroken(HearthError):
    code = "generation_error"


class UpstreamBroken(StreamBroken):
    """A remote engine's stream that failed after it began (cut, malformed, over a bound)."""

    status = 502
    code = "provider_error"


class ShuttingDown(HearthError):
    status = 503
    code = "server_shutting_down"


def request_deadline(request: web.Request) -> float:
    """The loop time by which this request must be done (set when it arrived)."""
    deadline = request.get(DEADLINE)
    if deadline is None:  # a route driven without the edge middleware (tests)
        deadline = asyncio.get_running_loop().time() + request.app[STATE].settings.request_timeout_s
        request[DEADLINE] = deadline
    return deadline


def _timeout_error(request: web.Request) -> GenerationTimeout:
    limit = request.app[STATE].settings.request_timeout_s
    return GenerationTimeout(f"the request ran over the server's time limit ({limit:g}s)")


async def timed(request: web.Request, gen: Generation) -> AsyncIterator[Delta]:
    """The deltas of ``gen`` under the request's deadline; registered for a clean shutdown.

    At the deadline the generation is cancelled (no per-token timer: one callback) and its
    final delta comes out as an error naming the time limit.
    """
    state = request.app[STATE]
    loop = asyncio.get_running_loop()
    state.active.add(gen)

    def expire() -> None:
        request[TIMED_OUT] = True
        gen.cancel()

    timer = loop.call_at(request_deadline(request), expire)
    info = request.get(REQUEST_LOG)
    try:
        async for d in gen:
            if info is not None and info.get("ttft_ms") is None and _has_payload(d):
                info["ttft_ms"] = (time.perf_counter() - info["arrived"]) * 1000.0
            if d.finish_reason is not None and request.get(TIMED_OUT):
                d = replace(d, finish_reason="error", error=_timeout_error(request).message)
            records.note_delta(request, d)  # time to first token, the answer's text
            yield d
    finally:
        timer.cancel()
        state.active.discard(gen)
        gen.cancel()


def final_error(request: web.Request, final: Delta | None) -> HearthError | None:
    """The error a generation's final delta stands for, if it did not finish normally."""
    if request.get(TIMED_OUT):
        return _timeout_error(request)
    if final is None:
        return StreamBroken("the generation ended without a result")
    if final.finish_reason == "error":
        broken = UpstreamBroken if final.error_code == "provider_error" else StreamBroken
        return broken(f"generation failed: {final.error or 'unknown error'}")
    if final.finish_reason == "cancelled":
        if final.error_code == "model_unloaded":
            return ModelUnloaded("the model was unloaded while this request ran; retry to load it")
        if request.app[STATE].stopping:
            return ShuttingDown("the server is shutting down; the generation was stopped")
        return StreamBroken("the generation was cancelled")
    return None


class ClientGone(ConnectionResetError):
    """A stream's write found the connection closed by the client: recorded as the client going
    away (499, ``cancelled``), as the cancel aiohttp sends when it sees the close first; aiohttp
    ignores a ``ConnectionError`` from a handler."""


class FrameWriter:
    """Writes an adapter's frames: SSE events (``event:`` line when named) or NDJSON lines."""

    def __init__(
        self, request: web.Request, framing: Framing, headers: dict[str, str] | None = None
    ) -> None:
        self.request = request
        self.framing = framing
        content_type = (
            "text/event-stream; charset=utf-8" if framing == "sse" else "application/x-ndjson"
        )
        self.response = web.StreamResponse(
            status=200,
            headers={
                "Content-Type": content_type,
                "Cache-Control": "no-cache",
                "X-Accel-Buffering": "no",
                **(headers or {}),
            },
        )

    async def start(self) -> None:
        await self.response.prepare(self.request)

    async def write(self, frames: list[Frame]) -> None:
        if not frames:
            return
        out = bytearray()
        for f in frames:
            data = f.data if isinstance(f.data, str) else json.dumps(f.data, separators=(",", ":"))
            if self.framing == "ndjson":
                out += data.encode() + b"\n"
            else:
                if f.event:
                    out += b"event: " + f.event.encode() + b"\n"
                out += b"data: " + data.encode() + b"\n\n"
        with _client_gone():
            await self.response.write(bytes(out))

    async def close(self) -> web.StreamResponse:
        with _client_gone():
            await self.response.write_eof()
        return self.response


@contextlib.contextmanager
def _client_gone() -> Iterator[None]:
    """A write that finds the connection closed by the client (before the loop saw it go)."""
    try:
        yield
    except ConnectionResetError as e:
        raise ClientGone("the client went away") from e


async def collect(request: web.Request, gen: Generation) -> Completion:
    """One generation run to its end under the request's deadline."""
    out = Completion(final=Delta(finish_reason="error", error="no final delta"))
    saw_final = False
    async for d in timed(request, gen):
        out.add(d)
        saw_final = saw_final or d.finish_reason is not None
    if not saw_final:
        raise StreamBroken("the generation ended without a result")
    return out


def _has_payload(d: Delta) -> bool:
    return bool(d.text or d.reasoning or d.tool_calls or d.logprobs)


async def respond(
    request: web.Request,
    choices: Choices,
    *,
    stream: bool,
    model: str,
    whole: Callable[[list[Completion]], Any],
    renderer: Callable[[], StreamRenderer],
) -> web.StreamResponse:
    """THE path every generation route ends in: the whole answer, or the stream, of a request's
    choices, under its time limit; a disconnect, a shutdown or an error after the headers are
    handled here once, and the request log gets each generation's tokens and speeds.

    Errors before any output (a later prompt's 404 or queue-full in a non-streamed answer, an
    error final delta) are raised, for the middleware to answer in the route's protocol shape;
    after the headers they become the protocol's error frames (``renderer().error``).
    """
    # the gateway's route: the model ids tried for this answer, in order (the last answered)
    headers = {"x-hearth-model": model, "x-hearth-route": ",".join(choices.route or [model])}
    if choices.cache is not None:  # the response cache's result, and the record's
        headers["x-hearth-cache"] = choices.cache
        records.note_cache(request, choices.cache)
    records.note_start(request, model, stream)
    try:
        if not stream:
            started = choices.started
            if len(started) == 1:  # no task to gather one answer
                results = [await collect(request, started[0])]
            else:
                results = list(await asyncio.gather(*(collect(request, g) for g in started)))
            for r in results:
                _finish(request, model, r.final)
            for i in range(len(results), choices.count):
                r = await collect(request, await choices.get(i))
                _finish(request, model, r.final)
                results.append(r)
            body = whole(results)
            # a started tool call that came back as text: why, on every protocol's answer
            issues = [r.final.tool_parse.reason for r in results if r.final.tool_parse]
            if issues:
                headers["x-hearth-tool-parse"] = ",".join(dict.fromkeys(issues))
            return web.json_response(body, headers=headers)
        r_ = renderer()
        writer = FrameWriter(request, r_.framing, headers)
        await writer.start()
        finals: list[Delta] = []
        try:
            await writer.write(r_.open())
            for i in range(choices.count):
                gen = await choices.get(i)
                last: Delta | None = None
                async for d in timed(request, gen):
                    if _has_payload(d):
                        await writer.write(r_.delta(i, d))
                    if d.finish_reason is not None:
                        last = d
                if last is None:
                    raise StreamBroken("the generation ended without a result")
                _finish(request, model, last)
                await writer.write(r_.end_choice(i, last))
                finals.append(last)
            await writer.write(r_.close(finals))
        except HearthError as e:
            records.note_error(request, e)  # the record's error code: its status stays 200
            await writer.write(r_.error(e))
        return await writer.close()
    finally:
        choices.cancel()


def _finish(request: web.Request, model: str, final: Delta) -> None:
    """Log a finished generation; raise the error it stands for, if it did not end normally."""
    note_generation(request, model, final)
    err = final_error(request, final)
    if err is not None:
        raise err


def note_generation(request: web.Request, model: str, final: Delta) -> None:
    """Put a finished generation's tokens and speeds in this request's log entry (added up
    when one request runs several generations, as with n > 1)."""
    info = request.get(REQUEST_LOG)
    if info is None:  # a route driven without the edge middleware (tests)
        return
    records.note_final(request, model, final)
    telemetry.note_generation(request, final)  # its phases as spans, when traced
    info["model"] = model
    if final.usage:
        info["prompt_tokens"] += final.usage.prompt_tokens
        info["completion_tokens"] += final.usage.completion_tokens
        info["cached_tokens"] += final.usage.cached_tokens
    if final.timings:
        info["tps"] = final.timings.predicted_per_second
        info["prompt_tps"] = final.timings.prompt_per_second
        info["batch_size"] = final.timings.batch_size
        info["cpu_busy"] = info["cpu_busy"] or final.timings.cpu_busy
