"""What every generation route shares: the request's time limit, shutdown, and how a
generation that did not finish normally is reported (one place for all four protocols).

The time limit (``server.request_timeout_s``) runs from the moment the request arrived and
covers the whole request: every generation it starts (``n`` choices, a list of prompts) and
the wait for the model. At the deadline the generations are cancelled, which stops them within
one token (or aborts their prompt); the stream then ends with an error final delta, which each
protocol writes as its own error event or error body.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace

from aiohttp import web

from app.core.generation import Generation
from app.core.types import Delta
from app.errors import GenerationTimeout, HearthError, ModelUnloaded
from app.server.state import STATE

DEADLINE = web.RequestKey("hearth_deadline", float)  # loop time the request must end by
TIMED_OUT = web.RequestKey("hearth_timed_out", bool)


class StreamBroken(HearthError):
    code = "generation_error"


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
    try:
        async for d in gen:
            if d.finish_reason is not None and request.get(TIMED_OUT):
                d = replace(d, finish_reason="error", error=_timeout_error(request).message)
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
        return StreamBroken(f"generation failed: {final.error or 'unknown error'}")
    if final.finish_reason == "cancelled":
        if final.error_code == "model_unloaded":
            return ModelUnloaded("the model was unloaded while this request ran; retry to load it")
        if request.app[STATE].stopping:
            return ShuttingDown("the server is shutting down; the generation was stopped")
        return StreamBroken("the generation was cancelled")
    return None
