"""Anthropic Messages: body -> ChatRequest, deltas -> message events (pure, no aiohttp).

The route in ``app/server/routes/anthropic.py`` hands the body here and writes what comes back
through the one streaming path. A reasoning model's think text is a ``thinking`` block (before
the text), streamed as ``thinking_delta``s; Hearth cannot sign it, so its signature is "".
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from app.core.inference.generation import Completion
from app.core.inference.images import IMAGE_MARKER, ImageSource, InvalidImage, neutralise_markers
from app.core.inference.tools import Tool
from app.core.requests import ChatRequest, ToolChoice
from app.core.types import ChatMessage, Delta, SamplingParams, ToolCall
from app.core.util import jsonsafe
from app.errors import HearthError, InvalidRequest, UnsupportedParameter
from app.server.protocols.base import Context, Frame, Protocol, StreamRenderer
from app.server.protocols.common import (
    MAX_TOKENS_LIMIT,
    Body,
    b64_image,
    check_stop,
    check_tool_count,
    image_from_url,
    make_tool,
    parse_ttl,
    tool_choice,
)

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    504: "timeout_error",
}
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def error_body(err: HearthError) -> dict[str, Any]:
    return {
        "type": "error",
        "error": {"type": ERROR_TYPES.get(err.status, "api_error"), "message": err.message},
    }


class Anthropic(Protocol):
    name = "anthropic"

    def error_body(self, err: HearthError) -> dict[str, Any]:
        return error_body(err)


# -- parsing -----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Parsed:
    request: ChatRequest
    stream: bool


def _blocks(
    content: Any, where: str, *, role: str
) -> tuple[str, list[ToolCall], list[ChatMessage], list[ImageSource]]:
    """(text, tool calls made, tool results given, images) of one message's content."""
    if isinstance(content, str):
        return neutralise_markers(content), [], [], []
    if not isinstance(content, list):
        raise InvalidRequest("content must be a string or an array of content blocks", param=where)
    parts = []
    calls: list[ToolCall] = []
    results: list[ChatMessage] = []
    images: list[ImageSource] = []
    for i, block in enumerate(content):
        if not isinstance(block, dict):
            raise InvalidRequest("content blocks must be objects", param=f"{where}[{i}]")
        kind = block.get("type")
        if kind == "text":
            if not isinstance(block.get("text"), str):
                raise InvalidRequest("a text block needs 'text'", param=f"{where}[{i}].text")
            parts.append(neutralise_markers(block["text"]))
        elif kind == "image":
            images.append(_image(block, f"{where}[{i}]"))
            parts.append(IMAGE_MARKER)
        elif kind == "tool_use" and role == "assistant":
            if not isinstance(block.get("name"), str) or not isinstance(
                block.get("input", {}), dict
            ):
                raise InvalidRequest("a tool_use block needs name and input", param=f"{where}[{i}]")
            args = json.dumps(block.get("input", {}))
            calls.append(ToolCall(str(block.get("id") or ""), block["name"], args))
        elif kind == "tool_result" and role == "user":
            inner = block.get("content", "")
            text, _, _, shown = _blocks(inner, f"{where}[{i}].content", role="user")
            if block.get("is_error"):
                text = f"Error: {text}"
            results.append(
                ChatMessage(
                    "tool",
                    text,
                    tool_call_id=str(block.get("tool_use_id") or ""),
                    image_sources=tuple(shown),
                )
            )
        elif kind in ("tool_use", "tool_result"):
            raise InvalidRequest(
                f"a '{kind}' block cannot be in a {role} message", param=f"{where}[{i}]"
            )
        elif kind == "document":
            raise UnsupportedParameter("'document' blocks are not supported", param=f"{where}[{i}]")
        elif kind in ("thinking", "redacted_thinking"):
            continue  # earlier reasoning is not sent back to the model
        else:
            raise InvalidRequest(f"unknown content block type {kind!r}", param=f"{where}[{i}].type")
    return "".join(parts), calls, results, images


_MEDIA_TYPES = ("image/jpeg", "image/png", "image/gif", "image/webp")


def _image(block: dict[str, Any], where: str) -> ImageSource:
    """An ``image`` block: a ``base64`` source (its ``media_type`` is checked against the
    bytes when decoded) or a ``url`` source (fetched under the server's URL policy)."""
    src = block.get("source")
    kind = src.get("type") if isinstance(src, dict) else None
    if not isinstance(src, dict) or kind not in ("base64", "url"):
        raise InvalidImage(
            "an image block needs a source of type base64 or url", param=f"{where}.source"
        )
    if kind == "url":
        return image_from_url(src.get("url"), f"{where}.source.url")
    media = src.get("media_type")
    if media not in _MEDIA_TYPES:
        raise InvalidImage(
            f"'media_type' must be one of {', '.join(_MEDIA_TYPES)}",
            param=f"{where}.source.media_type",
        )
    data = b64_image(src.get("data"), f"{where}.source.data")
    return ImageSource(
        f"{where}.source.data",
        data=data,
        media_type=media,
        media_param=f"{where}.source.media_type",
    )


def parse_messages(b: Body) -> list[ChatMessage]:
    """``system`` and ``messages`` (tool results become tool messages before their turn)."""
    msgs: list[ChatMessage] = []
    system = b.data.get("system")
    if system is not None:
        text, _, _, pictures = _blocks(system, "system", role="user")
        if pictures:
            raise InvalidRequest("the system prompt takes text only", param="system")
        msgs.append(ChatMessage("system", text))
    raw = b.data.get("messages")
    if not isinstance(raw, list) or not raw:
        raise InvalidRequest("'messages' must be a non-empty array", param="messages")
    for i, m in enumerate(raw):
        # a system message may stand anywhere in the list (Anthropic's API takes it there, and
        # Claude Code sends one after the first turn): it applies from its place on
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant", "system"):
            raise InvalidRequest(
                "each message needs role user, assistant or system", param=f"messages[{i}].role"
            )
        text, calls, results, images = _blocks(
            m.get("content", ""), f"messages[{i}].content", role=m["role"]
        )
        msgs.extend(results)  # tool results come first: they answer the previous turn's calls
        if text or calls or not results:
            msgs.append(
                ChatMessage(m["role"], text, tool_calls=tuple(calls), image_sources=tuple(images))
            )
    return msgs


def parse_tools(b: Body) -> tuple[list[Tool], ToolChoice]:
    """Anthropic tools ({name, description, input_schema}) and tool_choice
    ({"type": auto | any | tool + name | none, "disable_parallel_tool_use"}), through the
    bounded validators every protocol shares."""
    tools = []
    params = []
    for i, t in enumerate(check_tool_count(b.data.get("tools") or None)):
        if not isinstance(t, dict):
            raise InvalidRequest("each tool must be an object", param=f"tools[{i}]")
        params.append(f"tools[{i}].input_schema")
        tools.append(
            make_tool(
                t.get("name"),
                t.get("description"),
                t.get("input_schema"),
                where=f"tools[{i}]",
                params=params[-1],
            )
        )
    tc = b.data.get("tool_choice") or {"type": "auto"}
    kind = tc.get("type") if isinstance(tc, dict) else None
    if kind not in ("auto", "any", "tool", "none"):
        raise InvalidRequest(
            "'tool_choice.type' must be auto, any, tool or none", param="tool_choice"
        )
    no_parallel = tc.get("disable_parallel_tool_use", False)
    if not isinstance(no_parallel, bool):
        raise InvalidRequest(
            "'disable_parallel_tool_use' must be a boolean",
            param="tool_choice.disable_parallel_tool_use",
        )
    if kind == "tool":
        if not isinstance(tc.get("name"), str):
            raise InvalidRequest("'tool_choice' of type tool needs a name", param="tool_choice")
        choice = tc["name"]
    elif kind == "any":
        choice = "required"
    else:
        choice = str(kind) if tools else "none"
    return tools, tool_choice(choice, tools, params, parallel=not no_parallel, param="tool_choice")


def parse_request(data: dict[str, Any], *, counting: bool = False) -> Parsed:
    """A Messages body -> the internal chat request. ``counting``: a count_tokens body, which
    has no ``max_tokens``."""
    b = Body(data)
    model = b.text("model") or ""  # none: default_model (the gateway), or a 400
    max_tokens = b.integer("max_tokens", None, lo=1, hi=MAX_TOKENS_LIMIT)
    if max_tokens is None and not counting:
        raise InvalidRequest("'max_tokens' is required", param="max_tokens")
    messages = parse_messages(b)
    stop = check_stop(b.data.get("stop_sequences"), "stop_sequences")
    sampling = SamplingParams(
        temperature=b.number("temperature", 1.0, lo=0.0, hi=1.0),
        top_p=b.number("top_p", 1.0, lo=0.0, hi=1.0),
        top_k=b.integer("top_k", 0, lo=0, hi=1_000_000) or 0,
    )
    tools, choice = parse_tools(b)
    req = ChatRequest(
        model=model,
        messages=tuple(messages),
        sampling=sampling,
        max_tokens=max_tokens,
        stop=stop,
        tools=tuple(tools),
        tool_choice=choice,
        ttl=parse_ttl(b),
    )
    return Parsed(req, b.flag("stream"))


# -- rendering ---------------------------------------------------------------------------------
def stop_reason(final: Delta, stops: Sequence[str]) -> tuple[str, str | None]:
    """Anthropic tells an end of turn from a stop sequence the caller gave."""
    if final.finish_reason == "stop" and final.stop_string in stops:
        return "stop_sequence", final.stop_string
    return STOP_REASONS.get(final.finish_reason or "stop", "end_turn"), None


def tool_block(tool_id: str | None, name: str | None, args: str) -> dict[str, Any]:
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


def message_id(ctx: Context) -> str:
    return "msg_" + ctx.id


def message_response(
    req: ChatRequest, results: Sequence[Completion], ctx: Context
) -> dict[str, Any]:
    """The whole message: thinking, text, then tool_use blocks."""
    r = results[0]
    reason, seq = stop_reason(r.final, req.stop)
    u = r.final.usage
    content: list[dict[str, Any]] = []
    if r.reasoning:
        content.append({"type": "thinking", "thinking": r.reasoning, "signature": ""})
    if r.text.strip() or not r.tool_calls:
        content.append({"type": "text", "text": r.text})
    content += [tool_block(c.id, c.name, c.arguments) for c in r.tool_calls]
    return {
        "id": message_id(ctx),
        "type": "message",
        "role": "assistant",
        "model": ctx.model,
        "content": content,
        "stop_reason": reason,
        "stop_sequence": seq,
        "usage": {
            "input_tokens": u.prompt_tokens if u else 0,
            "output_tokens": u.completion_tokens if u else 0,
        },
    }


def _event(kind: str, **data: Any) -> Frame:
    return Frame({"type": kind, **data}, event=kind)


class MessageStream(StreamRenderer):
    """message_start, then content blocks one at a time (thinking, text, tool_use: each opened
    when its first piece comes, closed before the next opens), message_delta, message_stop."""

    def __init__(self, req: ChatRequest, ctx: Context, prompt_tokens: int) -> None:
        self.req = req
        self.ctx = ctx
        self.prompt_tokens = prompt_tokens
        self.open_block: int | None = None
        self.open_kind: str | None = None  # "thinking" | "text" | "tool_use"
        self.tool_blocks: dict[int, int] = {}  # tool call index -> its block index
        self.next_index = 0

    def open(self) -> list[Frame]:
        message: dict[str, Any] = {
            "id": message_id(self.ctx),
            "type": "message",
            "role": "assistant",
            "model": self.ctx.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": self.prompt_tokens, "output_tokens": 0},
        }
        return [_event("message_start", message=message), _event("ping")]

    def _close_block(self) -> list[Frame]:
        if self.open_block is None:
            return []
        out = []
        if self.open_kind == "thinking":  # Anthropic sends the signature just before the stop
            out.append(self._delta({"type": "signature_delta", "signature": ""}))
        out.append(_event("content_block_stop", index=self.open_block))
        self.open_block = self.open_kind = None
        return out

    def _start_block(self, block: dict[str, Any]) -> list[Frame]:
        out = self._close_block()
        self.open_block, self.open_kind = self.next_index, block["type"]
        self.next_index += 1
        out.append(_event("content_block_start", index=self.open_block, content_block=block))
        return out

    def _delta(self, delta: dict[str, Any], index: int | None = None) -> Frame:
        return _event(
            "content_block_delta",
            index=self.open_block if index is None else index,
            delta=delta,
        )

    def _arguments(self, index: int, fragments: list[str]) -> Frame:
        return self._delta(
            {"type": "input_json_delta", "partial_json": "".join(fragments)},
            self.tool_blocks[index],
        )

    def delta(self, i: int, d: Delta) -> list[Frame]:
        # one delta may end a call, carry text and start calls: keep that order on the wire,
        # since each block must be complete before the next one starts
        out: list[Frame] = []
        fresh = [tc for tc in d.tool_calls if tc.id is not None]
        fragments: dict[int, list[str]] = {}
        for tc in d.tool_calls:
            if tc.id is None and tc.arguments:
                fragments.setdefault(tc.index, []).append(tc.arguments)
        started = {tc.index for tc in fresh}
        out += [self._arguments(k, parts) for k, parts in fragments.items() if k not in started]
        if d.reasoning:
            if self.open_kind != "thinking":
                out += self._start_block({"type": "thinking", "thinking": "", "signature": ""})
            out.append(self._delta({"type": "thinking_delta", "thinking": d.reasoning}))
        text_open = self.open_kind == "text"
        if d.text and (d.text.strip() or text_open):
            if not text_open:  # text after a tool call goes in a new text block
                out += self._start_block({"type": "text", "text": ""})
            out.append(self._delta({"type": "text_delta", "text": d.text}))
        for tc in fresh:
            out += self._start_block(tool_block(tc.id, tc.name, ""))
            self.tool_blocks[tc.index] = self.next_index - 1
            if tc.index in fragments:
                out.append(self._arguments(tc.index, fragments[tc.index]))
        return out

    def end_choice(self, i: int, final: Delta) -> list[Frame]:
        out = []
        if self.next_index == 0:  # an empty answer still has one (empty) text block
            out += self._start_block({"type": "text", "text": ""})
        out += self._close_block()
        reason, seq = stop_reason(final, self.req.stop)
        u = final.usage
        out.append(
            _event(
                "message_delta",
                delta={"stop_reason": reason, "stop_sequence": seq},
                usage={"output_tokens": u.completion_tokens if u else 0},
            )
        )
        return out

    def close(self, finals: Sequence[Delta]) -> list[Frame]:
        return [_event("message_stop")]

    def error(self, err: HearthError) -> list[Frame]:
        # the one error event a broken stream gets: no block stop, no message_stop after it
        return [Frame(error_body(err), event="error")]
