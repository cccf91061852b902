"""OpenAI Responses, rendered: deltas -> response events carrying
``sequence_number``, and the whole response object (pure, no aiohttp).

Output items in order: a ``reasoning`` item for a reasoning model's think text (its
``reasoning_text`` content), the assistant ``message``, then one ``function_call`` per call.

Logprobs, when asked for: the ``output_text`` part's ``logprobs`` lists every generated token
(as chat completions' ``logprobs.content`` does); each ``response.output_text.delta`` carries
those of its text (and of tokens before it that wrote none, such as held-back text), and
``response.output_text.done`` the whole list. Off, they are ``[]``.
Tested by tests/server/protocols/responses/test_adapter.py.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from app.core.inference.generation import Completion
from app.core.types import Delta, TokenLogprob
from app.errors import HearthError
from app.server.protocols.base import Context, Frame, StreamRenderer
from app.server.protocols.common import token_logprobs, tool_parse_field
from app.server.protocols.responses.parse import Echo


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


def response_object(
    ctx: Context, echo: Echo, status: str, output: list[Any], final: Delta | None
) -> dict[str, Any]:
    incomplete = None
    if final is not None and final.finish_reason == "length":
        status, incomplete = "incomplete", {"reason": "max_output_tokens"}
    return {
        "id": "resp_" + ctx.id,
        "object": "response",
        "created_at": int(ctx.created),
        "status": status,
        "model": ctx.model,
        "output": output,
        "error": None,
        "incomplete_details": incomplete,
        "instructions": echo.instructions,
        "max_output_tokens": echo.max_output_tokens,
        "parallel_tool_calls": True,
        "previous_response_id": echo.previous_response_id,
        "store": echo.store,
        "temperature": echo.temperature,
        "top_p": echo.top_p,
        "top_logprobs": echo.top_logprobs,
        "text": {"format": echo.text_format},
        "tool_choice": "auto",
        "tools": [],
        "truncation": "disabled",
        "metadata": {},
        "usage": _usage(final) if final is not None else None,
        **tool_parse_field(final),
    }


def _fc_id(call_id: str) -> str:
    return "fc_" + call_id.removeprefix("call_")


def function_call(
    call_id: str, name: str | None, args: str, status: str, echo: Echo | None = None
) -> dict[str, Any]:
    item = {
        "type": "function_call",
        "id": _fc_id(call_id),
        "call_id": call_id,
        "name": name,
        "arguments": args,
        "status": status,
    }
    namespace = echo.namespaces.get(name or "") if echo is not None else None
    if namespace is not None:
        item["namespace"] = namespace
    return item


def output_text(text: str, lps: Sequence[TokenLogprob] = ()) -> dict[str, Any]:
    """The message's ``output_text`` part: its text and its tokens' logprobs (``[]`` when off)."""
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": token_logprobs(lps)}


def message(mid: str, text: str, status: str, lps: Sequence[TokenLogprob] = ()) -> dict[str, Any]:
    return {
        "type": "message",
        "id": mid,
        "status": status,
        "role": "assistant",
        "content": [output_text(text, lps)] if status == "completed" or text else [],
    }


def reasoning(rid: str, text: str, status: str) -> dict[str, Any]:
    return {
        "type": "reasoning",
        "id": rid,
        "summary": [],
        "content": [{"type": "reasoning_text", "text": text}] if status == "completed" else [],
        "status": status,
    }


def response_body(echo: Echo, results: Sequence[Completion], ctx: Context) -> dict[str, Any]:
    """The whole response: reasoning, the message, then function calls."""
    r = results[0]
    output = [reasoning("rs_" + ctx.id, r.reasoning, "completed")] if r.reasoning else []
    if r.text.strip() or not r.tool_calls:
        output.append(message("msg_" + ctx.id, r.text, "completed", r.logprobs))
    output += [function_call(c.id, c.name, c.arguments, "completed", echo) for c in r.tool_calls]
    return response_object(ctx, echo, "completed", output, r.final)


@dataclass
class _Reasoning:
    index: int
    id: str
    text: str = ""


class ResponseStream(StreamRenderer):
    """response.created / in_progress, then output items as they come (a reasoning item closes
    when the answer starts; the message and calls close at the end), response.completed (or
    .incomplete at max_output_tokens). Every event carries the next ``sequence_number``.
    ``on_done`` gets the finished response object before that last event is written (a
    stored response is kept by then)."""

    def __init__(
        self,
        echo: Echo,
        ctx: Context,
        on_done: Callable[[dict[str, Any]], object] | None = None,
    ) -> None:
        self.echo = echo
        self.ctx = ctx
        self.on_done = on_done
        self.seq = 0
        self.next_index = 0
        self.done: dict[int, dict[str, Any]] = {}  # output index -> its finished item
        self.reasoning: _Reasoning | None = None  # the open reasoning item
        self.reasoning_items = 0
        self.mid = "msg_" + ctx.id
        self.message_index: int | None = None
        self.text = ""
        self.logprobs: list[TokenLogprob] = []  # every token's, for the done events
        self.unsent = 0  # how many of them no output_text.delta has carried yet
        self.calls: dict[int, list[Any]] = {}  # tool index -> [output index, id, name, args]

    def _event(self, kind: str, **data: Any) -> Frame:
        frame = Frame({"type": kind, "sequence_number": self.seq, **data}, event=kind)
        self.seq += 1
        return frame

    def _take_index(self) -> int:
        self.next_index += 1
        return self.next_index - 1

    def open(self) -> list[Frame]:
        r = response_object(self.ctx, self.echo, "in_progress", [], None)
        return [
            self._event("response.created", response=r),
            self._event("response.in_progress", response=r),
        ]

    def _open_reasoning(self) -> tuple[_Reasoning, list[Frame]]:
        rid = "rs_" + self.ctx.id + (f"_{self.reasoning_items}" if self.reasoning_items else "")
        self.reasoning_items += 1
        r = self.reasoning = _Reasoning(self._take_index(), rid)
        return r, [
            self._event(
                "response.output_item.added",
                output_index=r.index,
                item=reasoning(r.id, "", "in_progress"),
            ),
            self._event(
                "response.content_part.added",
                item_id=r.id,
                output_index=r.index,
                content_index=0,
                part={"type": "reasoning_text", "text": ""},
            ),
        ]

    def _close_reasoning(self) -> list[Frame]:
        r = self.reasoning
        if r is None:
            return []
        self.reasoning = None
        item = self.done[r.index] = reasoning(r.id, r.text, "completed")
        where = {"item_id": r.id, "output_index": r.index, "content_index": 0}
        return [
            self._event("response.reasoning_text.done", **where, text=r.text),
            self._event(
                "response.content_part.done",
                **where,
                part={"type": "reasoning_text", "text": r.text},
            ),
            self._event("response.output_item.done", output_index=r.index, item=item),
        ]

    def _open_message(self) -> tuple[int, list[Frame]]:
        if self.message_index is not None:
            return self.message_index, []
        index = self.message_index = self._take_index()
        return index, [
            self._event(
                "response.output_item.added",
                output_index=index,
                item=message(self.mid, "", "in_progress"),
            ),
            self._event(
                "response.content_part.added",
                item_id=self.mid,
                output_index=index,
                content_index=0,
                part=output_text(""),
            ),
        ]

    def delta(self, i: int, d: Delta) -> list[Frame]:
        out: list[Frame] = []
        self.logprobs += d.logprobs
        self.unsent += len(d.logprobs)
        if d.reasoning:
            r = self.reasoning
            if r is None:
                r, opened = self._open_reasoning()
                out += opened
            r.text += d.reasoning
            out.append(
                self._event(
                    "response.reasoning_text.delta",
                    item_id=r.id,
                    output_index=r.index,
                    content_index=0,
                    delta=d.reasoning,
                )
            )
        if not (d.text or d.tool_calls):
            return out
        out += self._close_reasoning()
        mi, opened = self._open_message()
        out += opened
        for tc in d.tool_calls:
            if tc.id is not None:
                call = self.calls[tc.index] = [self._take_index(), tc.id, tc.name, ""]
                out.append(
                    self._event(
                        "response.output_item.added",
                        output_index=call[0],
                        item=function_call(tc.id, tc.name, "", "in_progress", self.echo),
                    )
                )
            if tc.arguments and tc.index in self.calls:
                call = self.calls[tc.index]
                call[3] += tc.arguments
                out.append(
                    self._event(
                        "response.function_call_arguments.delta",
                        item_id=_fc_id(call[1]),
                        output_index=call[0],
                        delta=tc.arguments,
                    )
                )
        if d.text:
            self.text += d.text
            lps = self.logprobs[len(self.logprobs) - self.unsent :]
            self.unsent = 0
            out.append(
                self._event(
                    "response.output_text.delta",
                    item_id=self.mid,
                    output_index=mi,
                    content_index=0,
                    delta=d.text,
                    logprobs=token_logprobs(lps),
                )
            )
        return out

    def end_choice(self, i: int, final: Delta) -> list[Frame]:
        out = self._close_reasoning()
        mi, opened = self._open_message()
        out += opened
        where = {"item_id": self.mid, "output_index": mi, "content_index": 0}
        item = self.done[mi] = message(self.mid, self.text, "completed", self.logprobs)
        part = item["content"][0]
        out += [
            self._event(
                "response.output_text.done",
                **where,
                text=self.text,
                logprobs=part["logprobs"],
            ),
            self._event("response.content_part.done", **where, part=part),
            self._event("response.output_item.done", output_index=mi, item=item),
        ]
        for index, call_id, name, args in (self.calls[k] for k in sorted(self.calls)):
            fc = self.done[index] = function_call(call_id, name, args, "completed", self.echo)
            out += [
                self._event(
                    "response.function_call_arguments.done",
                    item_id=_fc_id(call_id),
                    output_index=index,
                    arguments=args,
                ),
                self._event("response.output_item.done", output_index=index, item=fc),
            ]
        return out

    def close(self, finals: Sequence[Delta]) -> list[Frame]:
        output = [self.done[k] for k in sorted(self.done)]
        done = response_object(self.ctx, self.echo, "completed", output, finals[0])
        if self.on_done is not None:
            self.on_done(done)
        kind = "response.incomplete" if done["status"] == "incomplete" else "response.completed"
        return [self._event(kind, response=done)]

    def error(self, err: HearthError) -> list[Frame]:
        return [
            self._event("error", code=err.code or "server_error", message=err.message, param=None)
        ]
