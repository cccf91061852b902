"""POST /v1/responses (stateless): input items and instructions mapped onto chat; streamed events
carry ``sequence_number``."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from aiohttp import web

from app.core.service import Hearth
from app.core.types import ChatMessage, Delta, SamplingParams
from app.errors import HearthError, InvalidRequest, UnsupportedParameter
from app.server.app import REQUEST_LOG, SERVICE, STATE, read_json_body
from app.server.schemas import MAX_SCHEMA_BYTES, MAX_SCHEMA_DEPTH, Body, _depth, parse_ttl
from app.server.sse import SSEWriter

routes = web.RouteTableDef()


def _content(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidRequest("content must be a string or an array of parts", param=where)
    out = []
    for i, part in enumerate(content):
        if not isinstance(part, dict):
            raise InvalidRequest("content parts must be objects", param=f"{where}[{i}]")
        kind = part.get("type")
        if kind in ("input_text", "output_text", "text"):
            if not isinstance(part.get("text"), str):
                raise InvalidRequest("a text part needs 'text'", param=f"{where}[{i}].text")
            out.append(part["text"])
        elif kind in ("input_image", "input_file", "input_audio"):
            raise UnsupportedParameter(
                f"'{kind}' needs a vision/audio model", param=f"{where}[{i}]"
            )
        else:
            raise InvalidRequest(f"unknown content part type {kind!r}", param=f"{where}[{i}].type")
    return "".join(out)


def parse_input(b: Body) -> list[ChatMessage]:
    msgs: list[ChatMessage] = []
    instructions = b.text("instructions")
    if instructions:
        msgs.append(ChatMessage("system", instructions))
    raw = b.data.get("input")
    if isinstance(raw, str):
        msgs.append(ChatMessage("user", raw))
        return msgs
    if not isinstance(raw, list) or not raw:
        raise InvalidRequest(
            "'input' must be a string or a non-empty array of items", param="input"
        )
    for i, item in enumerate(raw):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise InvalidRequest("input items must be objects", param=where)
        kind = item.get("type", "message")
        if kind != "message":
            raise UnsupportedParameter(
                f"input item type '{kind}' arrives with tool calling", param=where
            )
        role = item.get("role")
        if role not in ("user", "assistant", "system", "developer"):
            raise InvalidRequest(f"unknown role {role!r}", param=f"{where}.role")
        msgs.append(
            ChatMessage(
                "system" if role == "developer" else role,
                _content(item.get("content"), f"{where}.content"),
            )
        )
    return msgs


def parse_text_format(b: Body) -> tuple[str, str] | None:
    text = b.data.get("text")
    if text is None:
        return None
    fmt = text.get("format") if isinstance(text, dict) else None
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise InvalidRequest("'text.format' must be an object", param="text.format")
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return ("json_object", "")
    if kind != "json_schema" or not isinstance(fmt.get("schema"), dict):
        raise InvalidRequest(
            "'text.format' must be text, json_object or json_schema with a schema",
            param="text.format",
        )
    if _depth(fmt["schema"], MAX_SCHEMA_DEPTH) > MAX_SCHEMA_DEPTH:
        raise InvalidRequest("the schema is nested too deeply", param="text.format.schema")
    raw = json.dumps(fmt["schema"])
    if len(raw) > MAX_SCHEMA_BYTES:
        raise InvalidRequest("the schema is too large", param="text.format.schema")
    return ("json_schema", raw)


def _usage(final: Delta | None) -> dict[str, Any]:
    u = final.usage if final else None
    p, c = (u.prompt_tokens, u.completion_tokens) if u else (0, 0)
    return {
        "input_tokens": p,
        "input_tokens_details": {"cached_tokens": u.cached_tokens if u else 0},
        "output_tokens": c,
        "output_tokens_details": {"reasoning_tokens": u.reasoning_tokens if u else 0},
        "total_tokens": p + c,
    }


def _response(
    rid: str,
    model: str,
    created: int,
    status: str,
    output: list[Any],
    final: Delta | None,
    body: Body,
    max_tokens: int | None,
) -> dict[str, Any]:
    incomplete = None
    if final is not None and final.finish_reason == "length":
        status, incomplete = "incomplete", {"reason": "max_output_tokens"}
    return {
        "id": rid,
        "object": "response",
        "created_at": created,
        "status": status,
        "model": model,
        "output": output,
        "error": None,
        "incomplete_details": incomplete,
        "instructions": body.data.get("instructions"),
        "max_output_tokens": max_tokens,
        "parallel_tool_calls": True,
        "previous_response_id": None,
        "store": False,
        "temperature": body.data.get("temperature", 1.0),
        "top_p": body.data.get("top_p", 1.0),
        "text": {"format": (body.data.get("text") or {}).get("format") or {"type": "text"}},
        "tool_choice": "auto",
        "tools": [],
        "truncation": "disabled",
        "metadata": {},
        "usage": _usage(final) if final is not None else None,
    }


def _message(mid: str, text: str, status: str) -> dict[str, Any]:
    return {
        "type": "message",
        "id": mid,
        "status": status,
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}]
        if status == "completed" or text
        else [],
    }


@routes.post("/v1/responses")
async def responses(request: web.Request) -> web.StreamResponse:
    service: Hearth = request.app[SERVICE]
    b = Body(await read_json_body(request))
    model = b.text("model", required=True) or ""
    if b.data.get("previous_response_id"):
        raise UnsupportedParameter(
            "Hearth's Responses API is stateless: send the whole conversation",
            param="previous_response_id",
        )
    if b.data.get("tools"):
        raise UnsupportedParameter("tools arrive with tool calling", param="tools")
    msgs = parse_input(b)
    constraint = parse_text_format(b)
    max_tokens = b.integer("max_output_tokens", None, lo=1, hi=1 << 20)
    sampling = SamplingParams(
        temperature=b.number("temperature", 1.0, lo=0.0, hi=2.0),
        top_p=b.number("top_p", 1.0, lo=0.0, hi=1.0),
    )
    request[REQUEST_LOG]["model"] = model
    gen = await service.chat(
        model,
        msgs,
        sampling=sampling,
        max_tokens=max_tokens,
        ttl=parse_ttl(b),
        constraint=constraint,
    )
    rid, mid, created = "resp_" + uuid.uuid4().hex, "msg_" + uuid.uuid4().hex, int(time.time())
    state = request.app[STATE]
    state.active.add(gen)
    try:
        if not b.flag("stream"):
            text, final = await gen.collect()
            if final.finish_reason in ("error", "cancelled"):
                raise HearthError(final.error or "the generation was stopped")
            return web.json_response(
                _response(
                    rid,
                    model,
                    created,
                    "completed",
                    [_message(mid, text, "completed")],
                    final,
                    b,
                    max_tokens,
                )
            )
        sse = SSEWriter(request)
        await sse.start()
        seq = 0

        async def event(kind: str, data: dict[str, Any]) -> None:
            nonlocal seq
            payload = {"type": kind, "sequence_number": seq, **data}
            seq += 1
            await sse.response.write(f"event: {kind}\ndata: {json.dumps(payload)}\n\n".encode())

        await event(
            "response.created",
            {"response": _response(rid, model, created, "in_progress", [], None, b, max_tokens)},
        )
        await event(
            "response.in_progress",
            {"response": _response(rid, model, created, "in_progress", [], None, b, max_tokens)},
        )
        await event(
            "response.output_item.added",
            {"output_index": 0, "item": _message(mid, "", "in_progress")},
        )
        await event(
            "response.content_part.added",
            {
                "item_id": mid,
                "output_index": 0,
                "content_index": 0,
                "part": {"type": "output_text", "text": "", "annotations": []},
            },
        )
        parts: list[str] = []
        last: Delta | None = None
        async for d in gen:
            if d.text:
                parts.append(d.text)
                await event(
                    "response.output_text.delta",
                    {
                        "item_id": mid,
                        "output_index": 0,
                        "content_index": 0,
                        "delta": d.text,
                        "logprobs": [],
                    },
                )
            if d.finish_reason:
                last = d
        if last is None or last.finish_reason in ("error", "cancelled"):
            msg = (
                "the server is shutting down" if state.stopping else (last.error if last else None)
            )
            await event(
                "error",
                {
                    "code": "server_error",
                    "message": msg or "the generation was stopped",
                    "param": None,
                },
            )
            return await sse.close()
        text = "".join(parts)
        await event(
            "response.output_text.done",
            {"item_id": mid, "output_index": 0, "content_index": 0, "text": text, "logprobs": []},
        )
        await event(
            "response.content_part.done",
            {
                "item_id": mid,
                "output_index": 0,
                "content_index": 0,
                "part": {"type": "output_text", "text": text, "annotations": []},
            },
        )
        item = _message(mid, text, "completed")
        await event("response.output_item.done", {"output_index": 0, "item": item})
        done = _response(rid, model, created, "completed", [item], last, b, max_tokens)
        await event(
            "response.incomplete" if done["status"] == "incomplete" else "response.completed",
            {"response": done},
        )
        return await sse.close()
    finally:
        state.active.discard(gen)
        gen.cancel()
