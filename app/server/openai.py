"""OpenAI-compatible routes: /v1/models, /v1/chat/completions, /v1/completions, /health."""

from __future__ import annotations

import asyncio
import base64
import json
import struct
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from aiohttp import web

from app import __version__
from app.core.generation import Generation
from app.core.service import Hearth, ModelStatus
from app.core.types import Delta, SamplingParams, TokenLogprob, ToolCallDelta
from app.errors import HearthError, InvalidRequest
from app.server.app import REQUEST_LOG, SERVICE, STATE, note_generation, read_json_body
from app.server.schemas import (
    MAX_PIECES,
    Body,
    parse_embedding_input,
    parse_logprobs,
    parse_max_tokens,
    parse_messages,
    parse_prompt,
    parse_response_format,
    parse_sampling,
    parse_stop,
    parse_stream,
    parse_template_vars,
    parse_tokenize_content,
    parse_tools,
    parse_ttl,
    reject_pending_features,
)
from app.server.sse import SSEWriter
from app.server.streaming import StreamBroken, final_error, timed

routes = web.RouteTableDef()


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
        "completion_tokens_details": {"reasoning_tokens": u.reasoning_tokens if u else 0},
    }


@dataclass
class _Result:
    text: str
    final: Delta
    logprobs: list[TokenLogprob]
    reasoning: str = ""
    tool_calls: list[dict[str, Any]] | None = None


async def _run_to_end(request: web.Request, gen: Generation) -> _Result:
    parts: list[str] = []
    thoughts: list[str] = []
    lps: list[TokenLogprob] = []
    calls: dict[int, dict[str, Any]] = {}
    final = Delta(finish_reason="error", error="no final delta")
    async for d in timed(request, gen):
        if d.text:
            parts.append(d.text)
        if d.reasoning:
            thoughts.append(d.reasoning)
        lps.extend(d.logprobs)
        for tc in d.tool_calls:
            c = calls.setdefault(
                tc.index,
                {"id": tc.id, "type": "function", "function": {"name": tc.name, "arguments": ""}},
            )
            c["function"]["arguments"] += tc.arguments
        if d.finish_reason:
            final = d
    tool_calls = [calls[i] for i in sorted(calls)] or None
    return _Result("".join(parts), final, lps, "".join(thoughts), tool_calls)


def _tool_call_delta(tc: ToolCallDelta) -> dict[str, Any]:
    """First delta of an index: id, type, name and empty arguments; later: index + fragment."""
    if tc.id is not None:
        return {
            "index": tc.index,
            "id": tc.id,
            "type": "function",
            "function": {"name": tc.name, "arguments": ""},
        }
    return {"index": tc.index, "function": {"arguments": tc.arguments}}


def _reasoning_fields(request: web.Request, text: str) -> dict[str, str]:
    """reasoning_content (DeepSeek's name, read by most clients), and `reasoning` if asked."""
    if not text:
        return {}
    out = {"reasoning_content": text}
    if request.app[STATE].settings.reasoning_field_also:
        out["reasoning"] = text
    return out


def chat_logprobs(lps: Sequence[TokenLogprob]) -> dict[str, Any]:
    """OpenAI's chat shape: content[].token/logprob/bytes/top_logprobs."""
    return {
        "content": [
            {
                "token": t.token,
                "logprob": t.logprob,
                "bytes": list(t.bytes),
                "top_logprobs": [
                    {"token": s, "logprob": lp, "bytes": list(bs)} for s, lp, bs in t.top
                ],
            }
            for t in lps
        ],
        "refusal": None,
    }


def completion_logprobs(lps: Sequence[TokenLogprob], offset: int = 0) -> dict[str, Any]:
    """The legacy completions shape: parallel arrays and text offsets."""
    offsets = []
    pos = offset
    for t in lps:
        offsets.append(pos)
        pos += len(t.token)
    return {
        "tokens": [t.token for t in lps],
        "token_logprobs": [t.logprob for t in lps],
        "top_logprobs": [{s: lp for s, lp, _ in t.top} for t in lps],
        "text_offset": offsets,
    }


def _check_model_field(b: Body) -> str:
    model = b.text("model", required=True)
    if not model:
        raise InvalidRequest("'model' must not be empty", param="model")
    return model


def _sum_usage(finals: list[Delta]) -> dict[str, Any]:
    total = _usage(finals[0])
    for f in finals[1:]:
        u = _usage(f)
        for k in ("prompt_tokens", "completion_tokens", "total_tokens"):
            total[k] += u[k]
        total["completion_tokens_details"]["reasoning_tokens"] += u["completion_tokens_details"][
            "reasoning_tokens"
        ]
    return total


async def _start_n(n: int, start: Any, sampling: SamplingParams) -> list[Generation]:
    """``n`` generations of one prompt; each its own seed so seeded choices still differ."""
    gens: list[Generation] = []
    try:
        for i in range(n):
            s = (
                sampling
                if sampling.seed is None or i == 0
                else replace(sampling, seed=sampling.seed + i)
            )
            gens.append(await start(s))
    except BaseException:
        for g in gens:
            g.cancel()
        raise
    return gens


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
    n = b.integer("n", 1, lo=1, hi=16) or 1
    n_lp = parse_logprobs(b, chat=True)
    constraint = parse_response_format(b)
    tools, tool_choice, parallel = parse_tools(b)
    template_vars = parse_template_vars(b)
    request[REQUEST_LOG]["model"] = model
    ttl = parse_ttl(b)

    async def start(s: SamplingParams) -> Generation:
        return await service.chat(
            model,
            messages,
            sampling=s,
            max_tokens=max_tokens,
            stop=stop,
            ttl=ttl,
            logprobs=n_lp,
            constraint=constraint,
            tools=tools,
            tool_choice=tool_choice,
            parallel_tool_calls=parallel,
            template_vars=template_vars,
        )

    # everything that can fail (404, context overflow, queue full) fails here, before headers
    gens = await _start_n(n, start, sampling)
    cid = "chatcmpl-" + uuid.uuid4().hex
    created = int(time.time())
    if not so.stream:
        try:
            results = await asyncio.gather(*(_run_to_end(request, g) for g in gens))
        finally:
            for g in gens:
                g.cancel()
        done = [r.final for r in results]
        for f in done:
            note_generation(request, model, f)
            err = final_error(request, f)
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
                        "index": i,
                        "message": {
                            "role": "assistant",
                            # content is null when the answer is only tool calls
                            "content": None if r.tool_calls and not r.text.strip() else r.text,
                            "refusal": None,
                            **_reasoning_fields(request, r.reasoning),
                            **({"tool_calls": r.tool_calls} if r.tool_calls else {}),
                        },
                        "logprobs": chat_logprobs(r.logprobs) if n_lp is not None else None,
                        "finish_reason": r.final.finish_reason,
                    }
                    for i, r in enumerate(results)
                ],
                "usage": _sum_usage(done),
                "timings": done[0].timings.as_dict() if done[0].timings else None,
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

    def chunk(
        i: int, delta: dict[str, Any], finish: str | None = None, lps: Sequence[TokenLogprob] = ()
    ) -> dict[str, Any]:
        lp = chat_logprobs(lps) if lps else None
        return {
            **base,
            "choices": [{"index": i, "delta": delta, "logprobs": lp, "finish_reason": finish}],
            **extra,
        }

    sse = SSEWriter(request, {"x-hearth-model": model})
    await sse.start()
    finals: list[Delta] = []
    try:
        for i, gen in enumerate(gens):  # choices one after the other, each with its index
            await sse.send(chunk(i, {"role": "assistant", "content": ""}))
            last: Delta | None = None
            async for d in timed(request, gen):
                if d.reasoning:
                    await sse.send(chunk(i, _reasoning_fields(request, d.reasoning)))
                if d.text or d.logprobs:
                    await sse.send(chunk(i, {"content": d.text}, lps=d.logprobs))
                if d.tool_calls:
                    await sse.send(
                        chunk(i, {"tool_calls": [_tool_call_delta(t) for t in d.tool_calls]})
                    )
                if d.finish_reason:
                    last = d
            if last is None:
                raise StreamBroken("the generation ended without a result")
            note_generation(request, model, last)
            err = final_error(request, last)
            if err:
                raise err
            await sse.send(chunk(i, {}, last.finish_reason))
            finals.append(last)
    except HearthError as e:
        await sse.send_error(e)
        return await sse.close()
    finally:
        for g in gens:
            g.cancel()
    if so.include_usage:
        usage_chunk = {**base, "choices": [], "usage": _sum_usage(finals)}
        if finals[0].timings:
            usage_chunk["timings"] = finals[0].timings.as_dict()
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
    n = b.integer("n", 1, lo=1, hi=16) or 1
    n_lp = parse_logprobs(b, chat=False)
    constraint = parse_response_format(b)  # an extension here, as vLLM and llama.cpp take it
    # choice k is prompt k // n, sample k % n (each its own seed when one is given)
    prompts = [p for p in prompts for _ in range(n)]
    cid = "cmpl-" + uuid.uuid4().hex
    created = int(time.time())

    def sampling_for(k: int) -> SamplingParams:
        if sampling.seed is None or k % n == 0:
            return sampling
        return replace(sampling, seed=sampling.seed + k % n)

    # the first prompt is validated (fit, 404, queue) before any output; the rest run in order
    first = await service.complete(
        model,
        prompts[0],
        sampling=sampling,
        max_tokens=max_tokens,
        stop=stop,
        ttl=ttl,
        logprobs=n_lp,
        constraint=constraint,
    )

    async def start(i: int) -> Generation:
        if i == 0:
            return first
        return await service.complete(
            model,
            prompts[i],
            sampling=sampling_for(i),
            max_tokens=max_tokens,
            stop=stop,
            ttl=ttl,
            logprobs=n_lp,
            constraint=constraint,
        )

    if not so.stream:
        choices = []
        total = None
        for i in range(len(prompts)):
            res = await _run_to_end(request, await start(i))
            text, final, lps = res.text, res.final, res.logprobs
            note_generation(request, model, final)
            err = final_error(request, final)
            if err:
                raise err
            choices.append(
                {
                    "index": i,
                    "text": text,
                    "logprobs": completion_logprobs(lps) if n_lp is not None else None,
                    "finish_reason": final.finish_reason,
                }
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
            offset = 0
            async for d in timed(request, gen):
                if d.text or d.logprobs:
                    lp = completion_logprobs(d.logprobs, offset) if n_lp is not None else None
                    offset += sum(len(t.token) for t in d.logprobs)
                    await sse.send(
                        {
                            **base,
                            "choices": [
                                {"index": i, "text": d.text, "logprobs": lp, "finish_reason": None}
                            ],
                            **extra,
                        }
                    )
                if d.finish_reason:
                    last = d
            if last is None:
                raise StreamBroken("the generation ended without a result")
            note_generation(request, model, last)
            err = final_error(request, last)
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

    def encode() -> str:  # ~1 s for 2,048 vectors: off the event loop
        data = []
        for i, v in enumerate(vectors):
            emb: Any = v
            if fmt == "base64":
                emb = base64.b64encode(struct.pack(f"<{len(v)}f", *v)).decode()
            data.append({"object": "embedding", "index": i, "embedding": emb})
        usage = {"prompt_tokens": n_tokens, "total_tokens": n_tokens}
        return json.dumps({"object": "list", "data": data, "model": model, "usage": usage})

    return web.Response(text=await asyncio.to_thread(encode), content_type="application/json")


@routes.post("/tokenize")
async def tokenize(request: web.Request) -> web.Response:
    """llama.cpp-style: {"model", "content", "add_special": false, "with_pieces": false}."""
    service: Hearth = request.app[SERVICE]
    b = Body(await read_json_body(request))
    model = _check_model_field(b)
    content = parse_tokenize_content(b)
    with_pieces = b.flag("with_pieces")
    async with service.using(model) as lm:
        tokens = await asyncio.to_thread(
            lm.tokenize,
            content,
            add_special=b.flag("add_special"),
            parse_special=b.flag("parse_special", True),
        )
        if with_pieces:
            if len(tokens) > MAX_PIECES:
                raise InvalidRequest(
                    f"'with_pieces' answers at most {MAX_PIECES} tokens; this text has "
                    f"{len(tokens)} (ask without pieces, or split the text)",
                    param="with_pieces",
                )
            pieces = await asyncio.to_thread(lm.token_pieces, tokens)
            return web.json_response(
                {"tokens": [{"id": t, "piece": p} for t, p in zip(tokens, pieces, strict=True)]}
            )
    return web.json_response({"tokens": tokens})


@routes.post("/detokenize")
async def detokenize(request: web.Request) -> web.Response:
    """llama.cpp-style: {"model", "tokens": [ids]} -> {"content"}."""
    service: Hearth = request.app[SERVICE]
    b = Body(await read_json_body(request))
    model = _check_model_field(b)
    tokens = b.data.get("tokens")
    if not isinstance(tokens, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) for t in tokens
    ):
        raise InvalidRequest("'tokens' must be an array of token ids", param="tokens")
    async with service.using(model) as lm:
        vocab = int(lm.special_tokens.get("n_vocab") or 0)
        if vocab and any(not 0 <= t < vocab for t in tokens):
            raise InvalidRequest(f"token ids must be in [0, {vocab})", param="tokens")
        content = await asyncio.to_thread(lm.detokenize, tokens)
    return web.json_response({"content": content})
