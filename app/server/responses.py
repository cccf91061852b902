"""POST /v1/responses (stateless): input items and instructions mapped onto chat; streamed events
carry ``sequence_number``."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from aiohttp import web

from app.core.service import Hearth
from app.core.tools import Tool
from app.core.types import ChatMessage, Delta, SamplingParams, ToolCall
from app.errors import InvalidRequest, UnsupportedParameter
from app.server.body import read_json_body
from app.server.protocols.common import (
    REASONING_EFFORTS,
    Body,
    check_forced_tools,
    check_tool_count,
    parse_template_vars,
    parse_ttl,
    schema_constraint,
    tool_parameters,
)
from app.server.sse import SSEWriter
from app.server.state import REQUEST_LOG, SERVICE
from app.server.streaming import StreamBroken, final_error, note_generation, timed

routes = web.RouteTableDef()


def _template_vars(b: Body) -> dict[str, Any] | None:
    """``reasoning.effort`` (the Responses spelling of ``reasoning_effort``) and
    ``chat_template_kwargs`` for the chat template."""
    out = parse_template_vars(b) or {}
    reasoning = b.data.get("reasoning")
    if reasoning is not None:
        if not isinstance(reasoning, dict):
            raise InvalidRequest("'reasoning' must be an object", param="reasoning")
        effort = reasoning.get("effort")
        if effort is not None:
            if effort not in REASONING_EFFORTS:
                raise InvalidRequest(
                    f"'reasoning.effort' must be one of {', '.join(REASONING_EFFORTS)}",
                    param="reasoning.effort",
                )
            out["reasoning_effort"] = effort
    return out or None


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
        if kind == "function_call":
            if not isinstance(item.get("name"), str) or not isinstance(
                item.get("arguments", ""), str
            ):
                raise InvalidRequest("a function_call item needs name and arguments", param=where)
            call = ToolCall(
                str(item.get("call_id") or ""), item["name"], item.get("arguments") or "{}"
            )
            if msgs and msgs[-1].role == "assistant" and not msgs[-1].content:
                prev = msgs.pop()  # consecutive calls belong to one assistant turn
                msgs.append(ChatMessage("assistant", "", tool_calls=(*prev.tool_calls, call)))
            else:
                msgs.append(ChatMessage("assistant", "", tool_calls=(call,)))
            continue
        if kind == "function_call_output":
            out = item.get("output")
            text = out if isinstance(out, str) else json.dumps(out)
            msgs.append(ChatMessage("tool", text, tool_call_id=str(item.get("call_id") or "")))
            continue
        if kind != "message":
            raise UnsupportedParameter(f"input item type '{kind}' is not supported", param=where)
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
    return schema_constraint(fmt["schema"], param="text.format.schema")


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


def _fc_id(call_id: str) -> str:
    return "fc_" + call_id.removeprefix("call_")


def _function_call(call_id: str, name: str | None, args: str, status: str) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": _fc_id(call_id),
        "call_id": call_id,
        "name": name,
        "arguments": args,
        "status": status,
    }


def parse_tools(b: Body) -> tuple[list[Tool], str, bool]:
    """Responses tools are flat: {"type": "function", "name", "description", "parameters"}."""
    tools = []
    for i, t in enumerate(check_tool_count(b.data.get("tools") or None)):
        if (
            not isinstance(t, dict)
            or t.get("type") != "function"
            or not isinstance(t.get("name"), str)
        ):
            raise UnsupportedParameter("only function tools are supported", param=f"tools[{i}]")
        params = tool_parameters(t.get("parameters"), param=f"tools[{i}].parameters")
        tools.append(Tool(t["name"], str(t.get("description") or ""), params))
    tc = b.data.get("tool_choice")
    choice = "auto" if tools else "none"
    if isinstance(tc, str):
        if tc not in ("none", "auto", "required"):
            raise InvalidRequest(
                "'tool_choice' must be none, auto, required or a function", param="tool_choice"
            )
        choice = tc
    elif isinstance(tc, dict):
        if tc.get("type") != "function" or not isinstance(tc.get("name"), str):
            raise InvalidRequest("'tool_choice' must name a function", param="tool_choice")
        choice = tc["name"]
    if not tools:
        choice = "none"
    check_forced_tools(tools, choice, [f"tools[{i}].parameters" for i in range(len(tools))])
    return tools, choice, b.flag("parallel_tool_calls", True)


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
    tools, tool_choice, parallel = parse_tools(b)
    msgs = parse_input(b)
    constraint = parse_text_format(b)
    max_tokens = b.integer("max_output_tokens", None, lo=1, hi=1 << 20)
    sampling = SamplingParams(
        temperature=b.number("temperature", 1.0, lo=0.0, hi=2.0),
        top_p=b.number("top_p", 1.0, lo=0.0, hi=1.0),
    )
    template_vars = _template_vars(b)
    request[REQUEST_LOG]["model"] = model
    gen = await service.chat(
        model,
        msgs,
        sampling=sampling,
        max_tokens=max_tokens,
        ttl=parse_ttl(b),
        constraint=constraint,
        tools=tools,
        tool_choice=tool_choice,
        parallel_tool_calls=parallel,
        template_vars=template_vars,
    )
    rid, mid, created = "resp_" + uuid.uuid4().hex, "msg_" + uuid.uuid4().hex, int(time.time())
    try:
        if not b.flag("stream"):
            pieces: list[str] = []
            calls: dict[int, list[Any]] = {}
            final: Delta | None = None
            async for d in timed(request, gen):
                pieces.append(d.text)
                for tc in d.tool_calls:
                    calls.setdefault(tc.index, [tc.id, tc.name, ""])[2] += tc.arguments
                if d.finish_reason:
                    final = d
            failed = final_error(request, final)
            if failed is not None or final is None:
                raise failed or StreamBroken("the generation ended without a result")
            note_generation(request, model, final)
            text = "".join(pieces)
            output = [_message(mid, text, "completed")] if text.strip() or not calls else []
            output += [
                _function_call(calls[i][0], calls[i][1], calls[i][2], "completed")
                for i in sorted(calls)
            ]
            return web.json_response(
                _response(
                    rid,
                    model,
                    created,
                    "completed",
                    output,
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
        items: dict[int, list[Any]] = {}  # tool index -> [id, name, arguments]
        async for d in timed(request, gen):
            for tc in d.tool_calls:
                if tc.id is not None:
                    items[tc.index] = [tc.id, tc.name, ""]
                    await event(
                        "response.output_item.added",
                        {
                            "output_index": 1 + tc.index,
                            "item": _function_call(tc.id, tc.name, "", "in_progress"),
                        },
                    )
                elif tc.arguments:
                    items[tc.index][2] += tc.arguments
                    await event(
                        "response.function_call_arguments.delta",
                        {
                            "item_id": _fc_id(items[tc.index][0]),
                            "output_index": 1 + tc.index,
                            "delta": tc.arguments,
                        },
                    )
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
        failed = final_error(request, last)
        if failed is not None or last is None:
            failed = failed or StreamBroken("the generation was stopped")
            await event(
                "error",
                {"code": failed.code or "server_error", "message": failed.message, "param": None},
            )
            return await sse.close()
        note_generation(request, model, last)
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
        output = [item]
        for i in sorted(items):
            call_id, name, args = items[i]
            await event(
                "response.function_call_arguments.done",
                {"item_id": _fc_id(call_id), "output_index": 1 + i, "arguments": args},
            )
            fc = _function_call(call_id, name, args, "completed")
            await event("response.output_item.done", {"output_index": 1 + i, "item": fc})
            output.append(fc)
        done = _response(rid, model, created, "completed", output, last, b, max_tokens)
        await event(
            "response.incomplete" if done["status"] == "incomplete" else "response.completed",
            {"response": done},
        )
        return await sse.close()
    finally:
        gen.cancel()
