"""OpenAI-compatible routes: /v1/models, /v1/chat/completions, /v1/completions, /health."""

from __future__ import annotations

import asyncio
import base64
import struct
import time
import uuid
from typing import Any

from aiohttp import web

from app import __version__
from app.core.service import Generation, Hearth, ModelStatus
from app.core.types import Delta
from app.errors import GenerationTimeout, HearthError, InvalidRequest
from app.server.app import REQUEST_LOG, SERVICE, STATE, read_json_body
from app.server.schemas import (
    Body,
    parse_embedding_input,
    parse_max_tokens,
    parse_messages,
    parse_prompt,
    parse_sampling,
    parse_stop,
    parse_stream,
    parse_ttl,
    reject_pending_features,
)
from app.server.sse import SSEWriter

routes = web.RouteTableDef()


class _StreamBroken(HearthError):
    code = "generation_error"


class _ShuttingDown(HearthError):
    status = 503
    code = "server_shutting_down"


def model_object(st: ModelStatus) -> dict[str, Any]:
    m = st.model
    return {
        "id": m.id,
        "object": "model",
        "created": int(m.added_at),
        "owned_by": "hearth",
        "state": st.state,
        "format": m.format,
        "runtime": st.runtime,
        "architecture": m.architecture,
        "quantization": m.quantization,
        "context_length": st.context_length or m.context_length,
        "max_context_length": m.context_length,
        "size_bytes": m.size_bytes,
        "memory_bytes": st.memory_bytes,
        "capabilities": ["embeddings"] if m.extra.get("embedding") else ["completion", "chat"],
    }


@routes.get("/health")
async def health(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    sched = service.scheduler
    return web.json_response(
        {
            "status": "ok",
            "version": __version__,
            "loaded": [i.model_id for i in sched.loaded()],
            "loading": sched.loading(),
        }
    )


@routes.get("/v1/models")
async def list_models(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    data = [model_object(s) for s in service.models()]
    return web.json_response({"object": "list", "data": data})


@routes.get("/v1/models/{model_id:.+}")
async def get_model(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    return web.json_response(model_object(service.model_status(request.match_info["model_id"])))


def _usage(d: Delta) -> dict[str, Any]:
    u = d.usage
    p, c, cached = (u.prompt_tokens, u.completion_tokens, u.cached_tokens) if u else (0, 0, 0)
    return {
        "prompt_tokens": p,
        "completion_tokens": c,
        "total_tokens": p + c,
        "prompt_tokens_details": {"cached_tokens": cached},
        "completion_tokens_details": {"reasoning_tokens": 0},
    }


def _note_usage(request: web.Request, model: str, final: Delta) -> None:
    info = request[REQUEST_LOG]
    info["model"] = model
    if final.usage:
        info["prompt_tokens"] += final.usage.prompt_tokens
        info["completion_tokens"] += final.usage.completion_tokens
    if final.timings:
        info["tps"] = final.timings.predicted_per_second


def _final_error(final: Delta, request: web.Request) -> HearthError | None:
    if final.finish_reason == "error":
        return _StreamBroken(f"generation failed: {final.error or 'unknown error'}")
    if final.finish_reason == "cancelled":
        if request.app[STATE].stopping:
            return _ShuttingDown("the server is shutting down; the generation was stopped")
        return _StreamBroken("the generation was cancelled")
    return None


async def _iterate(request: web.Request, gen: Generation):  # type: ignore[no-untyped-def]
    """Deltas of ``gen`` under the request time limit; registers it for shutdown."""
    state = request.app[STATE]
    state.active.add(gen)
    try:
        async with asyncio.timeout(state.settings.request_timeout_s):
            async for d in gen:
                yield d
    except TimeoutError:
        raise GenerationTimeout(
            f"the request ran over the server's time limit ({state.settings.request_timeout_s:g}s)"
        ) from None
    finally:
        state.active.discard(gen)
        gen.cancel()


async def _run_to_end(request: web.Request, gen: Generation) -> tuple[str, Delta]:
    parts: list[str] = []
    final = Delta(finish_reason="error", error="no final delta")
    async for d in _iterate(request, gen):
        if d.text:
            parts.append(d.text)
        if d.finish_reason:
            final = d
    return "".join(parts), final


def _check_model_field(b: Body) -> str:
    model = b.text("model", required=True)
    if not model:
        raise InvalidRequest("'model' must not be empty", param="model")
    return model


@routes.post("/v1/chat/completions")
async def chat_completions(request: web.Request) -> web.StreamResponse:
    service: Hearth = request.app[SERVICE]
    b = Body(await read_json_body(request))
    model = _check_model_field(b)
    messages = parse_messages(b)
    sampling = parse_sampling(b)
    stop = parse_stop(b)
    max_tokens = parse_max_tokens(b)
    so = parse_stream(b)
    reject_pending_features(b, chat=True)
    request[REQUEST_LOG]["model"] = model
    ttl = parse_ttl(b)
    # everything that can fail (404, context overflow, queue full) fails here, before headers
    gen = await service.chat(
        model, messages, sampling=sampling, max_tokens=max_tokens, stop=stop, ttl=ttl
    )
    cid = "chatcmpl-" + uuid.uuid4().hex
    created = int(time.time())
    if not so.stream:
        text, final = await _run_to_end(request, gen)
        _note_usage(request, model, final)
        err = _final_error(final, request)
        if err:
            raise err
        return web.json_response(
            {
                "id": cid,
                "object": "chat.completion",
                "created": created,
                "model": model,
                "system_fingerprint": f"hearth-{__version__}",
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": text, "refusal": None},
                        "logprobs": None,
                        "finish_reason": final.finish_reason,
                    }
                ],
                "usage": _usage(final),
                "timings": final.timings.as_dict() if final.timings else None,
            }
        )

    base = {
        "id": cid,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "system_fingerprint": f"hearth-{__version__}",
    }
    extra = {"usage": None} if so.include_usage else {}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {
            **base,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
            **extra,
        }

    sse = SSEWriter(request, {"x-hearth-model": model})
    await sse.start()
    await sse.send(chunk({"role": "assistant", "content": ""}))
    last: Delta | None = None
    try:
        async for d in _iterate(request, gen):
            if d.text:
                await sse.send(chunk({"content": d.text}))
            if d.finish_reason:
                last = d
    except GenerationTimeout as e:
        await sse.send_error(e)
        return await sse.close()
    if last is None:
        await sse.send_error(_StreamBroken("the generation ended without a result"))
        return await sse.close()
    _note_usage(request, model, last)
    err = _final_error(last, request)
    if err:
        await sse.send_error(err)
        return await sse.close()
    await sse.send(chunk({}, last.finish_reason))
    if so.include_usage:
        usage_chunk = {**base, "choices": [], "usage": _usage(last)}
        if last.timings:
            usage_chunk["timings"] = last.timings.as_dict()
        await sse.send(usage_chunk)
    await sse.done()
    return await sse.close()


@routes.post("/v1/completions")
async def completions(request: web.Request) -> web.StreamResponse:
    service: Hearth = request.app[SERVICE]
    b = Body(await read_json_body(request))
    model = _check_model_field(b)
    prompts = parse_prompt(b)
    sampling = parse_sampling(b)
    stop = parse_stop(b)
    max_tokens = parse_max_tokens(b)
    if max_tokens is None and not b.has("max_tokens"):
        max_tokens = 16  # OpenAI's documented default for legacy completions
    so = parse_stream(b)
    reject_pending_features(b, chat=False)
    request[REQUEST_LOG]["model"] = model
    ttl = parse_ttl(b)
    cid = "cmpl-" + uuid.uuid4().hex
    created = int(time.time())
    # validate every prompt (fit, 404) before any output; generations then run in order
    first = await service.complete(
        model, prompts[0], sampling=sampling, max_tokens=max_tokens, stop=stop, ttl=ttl
    )

    async def start(i: int) -> Generation:
        if i == 0:
            return first
        return await service.complete(
            model, prompts[i], sampling=sampling, max_tokens=max_tokens, stop=stop, ttl=ttl
        )

    if not so.stream:
        choices = []
        total = None
        for i in range(len(prompts)):
            text, final = await _run_to_end(request, await start(i))
            _note_usage(request, model, final)
            err = _final_error(final, request)
            if err:
                raise err
            choices.append(
                {"index": i, "text": text, "logprobs": None, "finish_reason": final.finish_reason}
            )
            u = _usage(final)
            if total is None:
                total = u
            else:
                for k in ("prompt_tokens", "completion_tokens", "total_tokens"):
                    total[k] += u[k]
        return web.json_response(
            {
                "id": cid,
                "object": "text_completion",
                "created": created,
                "model": model,
                "system_fingerprint": f"hearth-{__version__}",
                "choices": choices,
                "usage": total,
            }
        )

    base = {
        "id": cid,
        "object": "text_completion",
        "created": created,
        "model": model,
        "system_fingerprint": f"hearth-{__version__}",
    }
    extra = {"usage": None} if so.include_usage else {}
    sse = SSEWriter(request, {"x-hearth-model": model})
    await sse.start()
    timings: dict[str, Any] | None = None
    totals = {
        "prompt_tokens": 0,
        "completion_tokens": 0,
        "total_tokens": 0,
        "prompt_tokens_details": {"cached_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": 0},
    }
    try:
        for i in range(len(prompts)):
            gen = await start(i)
            last: Delta | None = None
            async for d in _iterate(request, gen):
                if d.text:
                    await sse.send(
                        {
                            **base,
                            "choices": [
                                {
                                    "index": i,
                                    "text": d.text,
                                    "logprobs": None,
                                    "finish_reason": None,
                                }
                            ],
                            **extra,
                        }
                    )
                if d.finish_reason:
                    last = d
            if last is None:
                raise _StreamBroken("the generation ended without a result")
            _note_usage(request, model, last)
            err = _final_error(last, request)
            if err:
                raise err
            await sse.send(
                {
                    **base,
                    "choices": [
                        {
                            "index": i,
                            "text": "",
                            "logprobs": None,
                            "finish_reason": last.finish_reason,
                        }
                    ],
                    **extra,
                }
            )
            u = _usage(last)
            for k in ("prompt_tokens", "completion_tokens", "total_tokens"):
                totals[k] += u[k]
            timings = last.timings.as_dict() if last.timings else None
    except HearthError as e:
        await sse.send_error(e)
        return await sse.close()
    if so.include_usage:
        await sse.send({**base, "choices": [], "usage": totals, "timings": timings})
    await sse.done()
    return await sse.close()


@routes.post("/v1/embeddings")
async def embeddings(request: web.Request) -> web.Response:
    service: Hearth = request.app[SERVICE]
    b = Body(await read_json_body(request))
    model = _check_model_field(b)
    inputs = parse_embedding_input(b)
    fmt = b.text("encoding_format", default="float")
    if fmt not in ("float", "base64"):
        raise InvalidRequest(
            "'encoding_format' must be 'float' or 'base64'", param="encoding_format"
        )
    dims = b.integer("dimensions", None, lo=1, hi=1 << 16)
    request[REQUEST_LOG]["model"] = model
    vectors, n_tokens = await service.embed(model, inputs, ttl=parse_ttl(b))
    if dims is not None and vectors and dims != len(vectors[0]):
        # truncating a non-Matryoshka embedding silently degrades it: say so instead
        raise InvalidRequest(
            f"this model's embeddings have {len(vectors[0])} dimensions and cannot be shortened",
            param="dimensions",
        )
    request[REQUEST_LOG]["prompt_tokens"] = n_tokens
    data = []
    for i, v in enumerate(vectors):
        emb: Any = v
        if fmt == "base64":
            emb = base64.b64encode(struct.pack(f"<{len(v)}f", *v)).decode()
        data.append({"object": "embedding", "index": i, "embedding": emb})
    return web.json_response(
        {
            "object": "list",
            "data": data,
            "model": model,
            "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
        }
    )
