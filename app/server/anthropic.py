"""POST /v1/messages: the Anthropic Messages API mapped onto the same core (stream and not)."""

from __future__ import annotations

import json
import uuid
from typing import Any

from aiohttp import web

from app.core.service import Hearth
from app.core.types import ChatMessage, Delta, SamplingParams
from app.errors import HearthError, InvalidRequest, UnsupportedParameter
from app.server.app import REQUEST_LOG, SERVICE, STATE, read_json_body
from app.server.schemas import Body, parse_ttl

routes = web.RouteTableDef()

STOP_REASONS = {"stop": "end_turn", "length": "max_tokens"}


def _text_of(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidRequest("content must be a string or an array of content blocks", param=where)
    parts = []
    for i, block in enumerate(content):
        if not isinstance(block, dict):
            raise InvalidRequest("content blocks must be objects", param=f"{where}[{i}]")
        kind = block.get("type")
        if kind == "text":
            if not isinstance(block.get("text"), str):
                raise InvalidRequest("a text block needs 'text'", param=f"{where}[{i}].text")
            parts.append(block["text"])
        elif kind in ("tool_use", "tool_result"):
            raise UnsupportedParameter(
                f"'{kind}' blocks arrive with tool calling", param=f"{where}[{i}]"
            )
        elif kind in ("image", "document"):
            raise UnsupportedParameter(
                f"'{kind}' blocks need a vision model", param=f"{where}[{i}]"
            )
        elif kind in ("thinking", "redacted_thinking"):
            continue  # earlier reasoning is not sent back to the model
        else:
            raise InvalidRequest(f"unknown content block type {kind!r}", param=f"{where}[{i}].type")
    return "".join(parts)


def parse_request(b: Body) -> tuple[list[ChatMessage], SamplingParams, int, tuple[str, ...]]:
    if b.data.get("tools"):
        raise UnsupportedParameter("tools arrive with tool calling", param="tools")
    max_tokens = b.integer("max_tokens", None, lo=1, hi=1 << 20)
    if max_tokens is None:
        raise InvalidRequest("'max_tokens' is required", param="max_tokens")
    msgs: list[ChatMessage] = []
    system = b.data.get("system")
    if system is not None:
        msgs.append(ChatMessage("system", _text_of(system, "system")))
    raw = b.data.get("messages")
    if not isinstance(raw, list) or not raw:
        raise InvalidRequest("'messages' must be a non-empty array", param="messages")
    for i, m in enumerate(raw):
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
            raise InvalidRequest(
                "each message needs role user or assistant", param=f"messages[{i}].role"
            )
        msgs.append(
            ChatMessage(m["role"], _text_of(m.get("content", ""), f"messages[{i}].content"))
        )
    stops = b.data.get("stop_sequences") or []
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise InvalidRequest("'stop_sequences' must be an array of strings", param="stop_sequences")
    sampling = SamplingParams(
        temperature=b.number("temperature", 1.0, lo=0.0, hi=1.0),
        top_p=b.number("top_p", 1.0, lo=0.0, hi=1.0),
        top_k=b.integer("top_k", 0, lo=0, hi=1_000_000) or 0,
    )
    return msgs, sampling, max_tokens, tuple(s for s in stops if s)


def _stop(final: Delta, stops: tuple[str, ...]) -> tuple[str, str | None]:
    """Anthropic tells an end of turn from a stop sequence the caller gave."""
    if final.finish_reason == "stop" and final.stop_string in stops:
        return "stop_sequence", final.stop_string
    return STOP_REASONS.get(final.finish_reason or "stop", "end_turn"), None


def _error(err: HearthError) -> dict[str, Any]:
    kind = {
        400: "invalid_request_error",
        401: "authentication_error",
        403: "permission_error",
        404: "not_found_error",
        413: "request_too_large",
        429: "rate_limit_error",
    }.get(err.status, "api_error")
    return {"type": "error", "error": {"type": kind, "message": err.message}}


@routes.post("/v1/messages")
async def messages(request: web.Request) -> web.StreamResponse:
    service: Hearth = request.app[SERVICE]
    try:
        b = Body(await read_json_body(request))
        model = b.text("model", required=True) or ""
        msgs, sampling, max_tokens, stops = parse_request(b)
        request[REQUEST_LOG]["model"] = model
        gen = await service.chat(
            model, msgs, sampling=sampling, max_tokens=max_tokens, stop=stops, ttl=parse_ttl(b)
        )
    except HearthError as e:
        return web.json_response(_error(e), status=e.status)
    msg_id = "msg_" + uuid.uuid4().hex
    state = request.app[STATE]
    state.active.add(gen)
    try:
        if not b.flag("stream"):
            text, final = await gen.collect()
            if final.finish_reason in ("error", "cancelled"):
                failed = HearthError(final.error or "the generation was stopped")
                return web.json_response(_error(failed), status=500)
            reason, seq = _stop(final, stops)
            u = final.usage
            request[REQUEST_LOG].update(
                prompt_tokens=u.prompt_tokens if u else 0,
                completion_tokens=u.completion_tokens if u else 0,
            )
            return web.json_response(
                {
                    "id": msg_id,
                    "type": "message",
                    "role": "assistant",
                    "model": model,
                    "content": [{"type": "text", "text": text}],
                    "stop_reason": reason,
                    "stop_sequence": seq,
                    "usage": {
                        "input_tokens": u.prompt_tokens if u else 0,
                        "output_tokens": u.completion_tokens if u else 0,
                    },
                }
            )
        resp = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await resp.prepare(request)

        async def event(kind: str, data: dict[str, Any]) -> None:
            await resp.write(
                f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n".encode()
            )

        await event(
            "message_start",
            {
                "message": {
                    "id": msg_id,
                    "type": "message",
                    "role": "assistant",
                    "model": model,
                    "content": [],
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": {"input_tokens": gen.prompt_tokens, "output_tokens": 0},
                }
            },
        )
        await event(
            "content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}}
        )
        await event("ping", {})
        last: Delta | None = None
        async for d in gen:
            if d.text:
                await event(
                    "content_block_delta",
                    {"index": 0, "delta": {"type": "text_delta", "text": d.text}},
                )
            if d.finish_reason:
                last = d
        if last is None or last.finish_reason in ("error", "cancelled"):
            msg = (
                "the server is shutting down" if state.stopping else (last.error if last else None)
            )
            await event("error", _error(HearthError(msg or "the generation was stopped")))
        else:
            reason, seq = _stop(last, stops)
            u = last.usage
            await event("content_block_stop", {"index": 0})
            await event(
                "message_delta",
                {
                    "delta": {"stop_reason": reason, "stop_sequence": seq},
                    "usage": {"output_tokens": u.completion_tokens if u else 0},
                },
            )
            await event("message_stop", {})
        await resp.write_eof()
        return resp
    finally:
        state.active.discard(gen)
        gen.cancel()
