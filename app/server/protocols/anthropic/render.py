"""Anthropic Messages, rendered: deltas -> message events, a whole message, and Anthropic's
error shape (pure, no aiohttp).

A reasoning model's think text is a ``thinking`` block (before the text), streamed as
``thinking_delta``s; Hearth cannot sign it, so its signature is "".
Tested by tests/server/protocols/anthropic/test_adapter.py and tests/server/clients/test_tools.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from app.core.inference.generation import Completion
from app.core.requests import ChatRequest
from app.core.types import Delta
from app.core.util import jsonsafe
from app.errors import HearthError
from app.server.protocols.base import Context, Frame, Protocol, StreamRenderer
from app.server.protocols.common import tool_parse_field

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
        **tool_parse_field(r.final),
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
                delta={"stop_reason": reason, "stop_sequence": seq, **tool_parse_field(final)},
                usage={"output_tokens": u.completion_tokens if u else 0},
            )
        )
        return out

    def close(self, finals: Sequence[Delta]) -> list[Frame]:
        return [_event("message_stop")]

    def error(self, err: HearthError) -> list[Frame]:
        # the one error event a broken stream gets: no block stop, no message_stop after it
        return [Frame(error_body(err), event="error")]
