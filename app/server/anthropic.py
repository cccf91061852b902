"""POST /v1/messages: the Anthropic Messages API mapped onto the same core (stream and not)."""

from __future__ import annotations

import json
import uuid
from typing import Any

from aiohttp import web

from app.core import jsonsafe
from app.core.service import Hearth
from app.core.tools import Tool
from app.core.types import ChatMessage, Delta, SamplingParams, ToolCall
from app.errors import HearthError, InvalidRequest, UnsupportedParameter
from app.server.body import read_json_body
from app.server.protocols.common import (
    Body,
    check_forced_tools,
    check_tool_count,
    parse_ttl,
    tool_parameters,
)
from app.server.state import REQUEST_LOG, SERVICE
from app.server.streaming import StreamBroken, final_error, note_generation, timed

routes = web.RouteTableDef()

STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def _text_of(content: Any, where: str) -> str:
    return _blocks(content, where, role="user")[0]


def _blocks(
    content: Any, where: str, *, role: str
) -> tuple[str, list[dict[str, Any]], list[ChatMessage]]:
    """(text, tool calls made, tool results given) of one message's content."""
    if isinstance(content, str):
        return content, [], []
    if not isinstance(content, list):
        raise InvalidRequest("content must be a string or an array of content blocks", param=where)
    parts = []
    calls: list[dict[str, Any]] = []
    results: list[ChatMessage] = []
    for i, block in enumerate(content):
        if not isinstance(block, dict):
            raise InvalidRequest("content blocks must be objects", param=f"{where}[{i}]")
        kind = block.get("type")
        if kind == "text":
            if not isinstance(block.get("text"), str):
                raise InvalidRequest("a text block needs 'text'", param=f"{where}[{i}].text")
            parts.append(block["text"])
        elif kind == "tool_use" and role == "assistant":
            if not isinstance(block.get("name"), str) or not isinstance(
                block.get("input", {}), dict
            ):
                raise InvalidRequest("a tool_use block needs name and input", param=f"{where}[{i}]")
            args = json.dumps(block.get("input", {}))
            calls.append(ToolCall(str(block.get("id") or ""), block["name"], args))
        elif kind == "tool_result" and role == "user":
            inner = block.get("content", "")
            text = (
                inner
                if isinstance(inner, str)
                else _blocks(inner, f"{where}[{i}].content", role="user")[0]
            )
            if block.get("is_error"):
                text = f"Error: {text}"
            results.append(
                ChatMessage("tool", text, tool_call_id=str(block.get("tool_use_id") or ""))
            )
        elif kind in ("tool_use", "tool_result"):
            raise InvalidRequest(
                f"a '{kind}' block cannot be in a {role} message", param=f"{where}[{i}]"
            )
        elif kind in ("image", "document"):
            raise UnsupportedParameter(
                f"'{kind}' blocks need a vision model", param=f"{where}[{i}]"
            )
        elif kind in ("thinking", "redacted_thinking"):
            continue  # earlier reasoning is not sent back to the model
        else:
            raise InvalidRequest(f"unknown content block type {kind!r}", param=f"{where}[{i}].type")
    return "".join(parts), calls, results


def parse_tools(b: Body) -> tuple[list[Tool], str]:
    """Anthropic tools ({name, description, input_schema}) and tool_choice (auto/any/tool/none)."""
    tools = []
    for i, t in enumerate(check_tool_count(b.data.get("tools") or None)):
        if not isinstance(t, dict) or not isinstance(t.get("name"), str) or not t["name"]:
            raise InvalidRequest("each tool needs a name", param=f"tools[{i}]")
        schema = tool_parameters(t.get("input_schema"), param=f"tools[{i}].input_schema")
        tools.append(Tool(t["name"], str(t.get("description") or ""), schema))
    tc = b.data.get("tool_choice") or {"type": "auto"}
    kind = tc.get("type") if isinstance(tc, dict) else None
    if kind not in ("auto", "any", "tool", "none"):
        raise InvalidRequest(
            "'tool_choice.type' must be auto, any, tool or none", param="tool_choice"
        )
    if kind == "tool":
        if not isinstance(tc.get("name"), str):
            raise InvalidRequest("'tool_choice' of type tool needs a name", param="tool_choice")
        choice = str(tc["name"])
    elif not tools:
        choice = "none"
    else:
        choice = "required" if kind == "any" else str(kind)
    check_forced_tools(tools, choice, [f"tools[{i}].input_schema" for i in range(len(tools))])
    return tools, choice


def parse_request(b: Body) -> tuple[list[ChatMessage], SamplingParams, int, tuple[str, ...]]:
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
        text, calls, results = _blocks(
            m.get("content", ""), f"messages[{i}].content", role=m["role"]
        )
        msgs.extend(results)  # tool results come first: they answer the previous turn's calls
        if text or calls or not results:
            msgs.append(ChatMessage(m["role"], text, tool_calls=tuple(calls)))
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
        504: "timeout_error",
    }.get(err.status, "api_error")
    return {"type": "error", "error": {"type": kind, "message": err.message}}


@routes.post("/v1/messages")
async def messages(request: web.Request) -> web.StreamResponse:
    service: Hearth = request.app[SERVICE]
    try:
        b = Body(await read_json_body(request))
        model = b.text("model", required=True) or ""
        msgs, sampling, max_tokens, stops = parse_request(b)
        tools, tool_choice = parse_tools(b)
        tc = b.data.get("tool_choice")
        parallel = not (isinstance(tc, dict) and tc.get("disable_parallel_tool_use"))
        request[REQUEST_LOG]["model"] = model
        gen = await service.chat(
            model,
            msgs,
            sampling=sampling,
            max_tokens=max_tokens,
            stop=stops,
            ttl=parse_ttl(b),
            tools=tools,
            tool_choice=tool_choice,
            parallel_tool_calls=parallel,
        )
    except HearthError as e:
        return web.json_response(_error(e), status=e.status)
    msg_id = "msg_" + uuid.uuid4().hex
    try:
        if not b.flag("stream"):
            return await _whole(request, gen, model, msg_id, stops)
        return await _stream(request, gen, model, msg_id, stops)
    finally:
        gen.cancel()


def _tool_block(tool_id: str | None, name: str | None, args: str) -> dict[str, Any]:
    try:
        value = jsonsafe.loads(args) if args else {}
    except ValueError:
        value = {}
    return {
        "type": "tool_use",
        "id": "toolu_" + (tool_id or "").removeprefix("call_"),
        "name": name,
        "input": value if isinstance(value, dict) else {},
    }


async def _whole(
    request: web.Request, gen: Any, model: str, msg_id: str, stops: tuple[str, ...]
) -> web.Response:
    parts: list[str] = []
    calls: dict[int, list[Any]] = {}
    final: Delta | None = None
    async for d in timed(request, gen):
        parts.append(d.text)
        for tc in d.tool_calls:
            c = calls.setdefault(tc.index, [tc.id, tc.name, ""])
            c[2] += tc.arguments
        if d.finish_reason:
            final = d
    failed = final_error(request, final)
    if failed is not None or final is None:
        failed = failed or StreamBroken("the generation ended without a result")
        return web.json_response(_error(failed), status=failed.status)
    reason, seq = _stop(final, stops)
    u = final.usage
    note_generation(request, model, final)
    text = "".join(parts)
    content: list[dict[str, Any]] = (
        [{"type": "text", "text": text}] if text.strip() or not calls else []
    )
    content += [_tool_block(*calls[i]) for i in sorted(calls)]
    return web.json_response(
        {
            "id": msg_id,
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": content,
            "stop_reason": reason,
            "stop_sequence": seq,
            "usage": {
                "input_tokens": u.prompt_tokens if u else 0,
                "output_tokens": u.completion_tokens if u else 0,
            },
        }
    )


async def _stream(
    request: web.Request, gen: Any, model: str, msg_id: str, stops: tuple[str, ...]
) -> web.StreamResponse:
    resp = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await resp.prepare(request)

    async def event(kind: str, data: dict[str, Any]) -> None:
        await resp.write(f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n".encode())

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
    await event("ping", {})
    # blocks open lazily: text first when the model writes text, then one per tool call
    open_block: int | None = None
    text_block: int | None = None
    tool_blocks: dict[int, int] = {}
    next_index = 0
    last: Delta | None = None

    async def arguments(index: int, fragments: list[str]) -> None:
        await event(
            "content_block_delta",
            {
                "index": tool_blocks[index],
                "delta": {"type": "input_json_delta", "partial_json": "".join(fragments)},
            },
        )

    async for d in timed(request, gen):
        # one delta may end a call, carry text and start calls: keep that order on the wire,
        # since each block must be complete before the next one starts
        fresh = [tc for tc in d.tool_calls if tc.id is not None]
        fragments: dict[int, list[str]] = {}
        for tc in d.tool_calls:
            if tc.id is None and tc.arguments:
                fragments.setdefault(tc.index, []).append(tc.arguments)
        started = {tc.index for tc in fresh}
        for i, parts in fragments.items():
            if i not in started:
                await arguments(i, parts)
        text_open = text_block is not None and open_block == text_block
        if d.text and (d.text.strip() or text_open):
            if not text_open:  # text after a tool call goes in a new text block
                if open_block is not None:
                    await event("content_block_stop", {"index": open_block})
                text_block = open_block = next_index
                next_index += 1
                await event(
                    "content_block_start",
                    {"index": text_block, "content_block": {"type": "text", "text": ""}},
                )
            await event(
                "content_block_delta",
                {"index": text_block, "delta": {"type": "text_delta", "text": d.text}},
            )
        for tc in fresh:
            if open_block is not None:
                await event("content_block_stop", {"index": open_block})
            tool_blocks[tc.index] = open_block = next_index
            next_index += 1
            block = _tool_block(tc.id, tc.name, "")
            await event("content_block_start", {"index": open_block, "content_block": block})
            if tc.index in fragments:
                await arguments(tc.index, fragments[tc.index])
        if d.finish_reason:
            last = d
    failed = final_error(request, last)
    if failed is not None or last is None:
        await event("error", _error(failed or StreamBroken("the generation was stopped")))
    else:
        if open_block is None:  # an empty answer still has one (empty) text block
            await event(
                "content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}}
            )
            open_block = 0
        await event("content_block_stop", {"index": open_block})
        reason, seq = _stop(last, stops)
        u = last.usage
        note_generation(request, model, last)
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
