"""OpenAI Responses (stateless): input items and instructions -> ChatRequest, deltas -> response
events carrying ``sequence_number`` (pure, no aiohttp).

Output items in order: a ``reasoning`` item for a reasoning model's think text (its
``reasoning_text`` content), the assistant ``message``, then one ``function_call`` per call.
Errors have OpenAI's shape (the route belongs to the OpenAI protocol).

Logprobs, as OpenAI: ``include: ["message.output_text.logprobs"]`` turns them on and
``top_logprobs`` (0-20) says how many alternatives each token comes with (alone it changes
nothing). The ``output_text`` part's ``logprobs`` then lists every generated token (as chat
completions' ``logprobs.content`` does); each ``response.output_text.delta`` carries those of its
text (and of tokens before it that wrote none, such as held-back text), and
``response.output_text.done`` the whole list. Off, they are ``[]``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from app.core.inference.generation import Completion
from app.core.inference.images import neutralise_markers
from app.core.inference.tools import Tool
from app.core.requests import ChatRequest, ToolChoice
from app.core.types import ChatMessage, Constraint, Delta, SamplingParams, TokenLogprob, ToolCall
from app.errors import HearthError, InvalidRequest, UnsupportedParameter
from app.server.protocols.base import Context, Frame, StreamRenderer
from app.server.protocols.common import (
    MAX_TOKENS_LIMIT,
    REASONING_EFFORTS,
    Body,
    check_tool_count,
    make_tool,
    parse_content,
    parse_template_vars,
    parse_top_logprobs,
    parse_ttl,
    schema_constraint,
    token_logprobs,
    tool_choice,
)
from app.server.protocols.openai import model_field

TOOL_CHOICES = ("none", "auto", "required")
LOGPROBS_INCLUDE = "message.output_text.logprobs"  # the ``include`` entry that asks for them


# -- parsing -----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Echo:
    """Request fields a response object repeats back."""

    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    text_format: dict[str, Any] = field(default_factory=lambda: {"type": "text"})
    # tool name -> the ``namespace`` tool it came in (Codex groups MCP and agent tools so):
    # a call of it names the namespace again, as the client dispatches on both
    namespaces: dict[str, str] = field(default_factory=dict)
    top_logprobs: int | None = None


@dataclass(frozen=True, slots=True)
class Parsed:
    request: ChatRequest
    stream: bool
    echo: Echo


def _template_vars(b: Body) -> dict[str, Any]:
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
    return out


def parse_input(b: Body) -> list[ChatMessage]:
    msgs: list[ChatMessage] = []
    instructions = b.text("instructions")
    if instructions:
        msgs.append(ChatMessage("system", neutralise_markers(instructions)))
    raw = b.data.get("input")
    if isinstance(raw, str):
        msgs.append(ChatMessage("user", neutralise_markers(raw)))
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
            text = neutralise_markers(out if isinstance(out, str) else json.dumps(out))
            msgs.append(ChatMessage("tool", text, tool_call_id=str(item.get("call_id") or "")))
            continue
        if kind == "reasoning":
            continue  # earlier reasoning is not sent back to the model (as on chat routes)
        if kind != "message":
            raise UnsupportedParameter(f"input item type '{kind}' is not supported", param=where)
        role = item.get("role")
        if role not in ("user", "assistant", "system", "developer"):
            raise InvalidRequest(f"unknown role {role!r}", param=f"{where}.role")
        text, images = parse_content(item.get("content"), f"{where}.content")
        msgs.append(
            ChatMessage("system" if role == "developer" else role, text, image_sources=images)
        )
    return msgs


def parse_text_format(b: Body) -> tuple[Constraint | None, dict[str, Any]]:
    """``text.format`` -> (the constraint or None, the format to echo back)."""
    text = b.data.get("text")
    if text is None:
        return None, {"type": "text"}
    if not isinstance(text, dict):
        raise InvalidRequest("'text' must be an object", param="text")
    fmt = text.get("format")
    if fmt is None:
        return None, {"type": "text"}
    if not isinstance(fmt, dict):
        raise InvalidRequest("'text.format' must be an object", param="text.format")
    kind = fmt.get("type")
    if kind == "text":
        return None, fmt
    if kind == "json_object":
        return Constraint("json_object"), fmt
    if kind != "json_schema" or not isinstance(fmt.get("schema"), dict):
        raise InvalidRequest(
            "'text.format' must be text, json_object or json_schema with a schema",
            param="text.format",
        )
    return schema_constraint(fmt["schema"], param="text.format.schema"), fmt


# tools OpenAI's servers run (or a client runs outside function calling): there is nothing
# here to run them, so they are left out and the model is not offered them; refusing the
# request instead made every Codex request a 400 (it always sends web_search)
HOSTED_TOOLS = frozenset(
    {
        "web_search", "web_search_preview", "file_search", "image_generation",
        "code_interpreter", "computer_use", "computer_use_preview", "mcp", "local_shell",
        "tool_search", "custom",
    }
)  # fmt: skip


def parse_logprobs(b: Body, top: int | None) -> int | None:
    """None unless ``include`` has "message.output_text.logprobs"; then ``top`` (the request's
    ``top_logprobs``), 0 when absent. Other ``include`` entries (Codex asks for
    ``reasoning.encrypted_content``) name nothing Hearth makes, and change nothing."""
    include = b.data.get("include")
    if include is None:
        return None
    if not isinstance(include, list) or not all(isinstance(x, str) for x in include):
        raise InvalidRequest("'include' must be an array of strings", param="include")
    return (top or 0) if LOGPROBS_INCLUDE in include else None


def parse_tools(b: Body) -> tuple[list[Tool], ToolChoice, dict[str, str]]:
    """Responses tools: {"type": "function", "name", "description", "parameters"}, and
    ``namespace`` groups of them (flattened; the map says which namespace a name came in);
    hosted tools are left out. ``tool_choice`` none | auto | required | {"type": "function",
    "name"}. The same bounded validators as chat completions."""
    tools: list[Tool] = []
    params: list[str] = []
    namespaces: dict[str, str] = {}
    for i, t in enumerate(check_tool_count(b.data.get("tools") or None)):
        kind = t.get("type") if isinstance(t, dict) else None
        if kind in HOSTED_TOOLS:
            continue
        if kind == "namespace" and isinstance(t, dict):
            inner = t.get("tools")
            if not isinstance(inner, list) or not isinstance(t.get("name"), str):
                raise InvalidRequest("a namespace tool needs name and tools", param=f"tools[{i}]")
            for j, f in enumerate(check_tool_count(inner)):
                where = f"tools[{i}].tools[{j}]"
                if isinstance(f, dict) and f.get("type") in HOSTED_TOOLS:
                    continue
                tool = _function_tool(f, where, params)
                namespaces[tool.name] = t["name"]
                tools.append(tool)
                check_tool_count(tools)  # a namespace's tools count as the others
            continue
        tools.append(_function_tool(t, f"tools[{i}]", params))
    tc = b.data.get("tool_choice")
    choice = "auto" if tools else "none"
    if isinstance(tc, str):
        if tc not in TOOL_CHOICES:
            raise InvalidRequest(
                "'tool_choice' must be none, auto, required or a function", param="tool_choice"
            )
        choice = tc
    elif isinstance(tc, dict):
        if tc.get("type") != "function" or not isinstance(tc.get("name"), str):
            raise InvalidRequest("'tool_choice' must name a function", param="tool_choice")
        choice = tc["name"]
    elif tc is not None:
        raise InvalidRequest("'tool_choice' must be a string or an object", param="tool_choice")
    parallel = b.flag("parallel_tool_calls", True)
    choice_ = tool_choice(choice, tools, params, parallel=parallel, param="tool_choice")
    return tools, choice_, namespaces


def _function_tool(t: Any, where: str, params: list[str]) -> Tool:
    if not isinstance(t, dict) or t.get("type") != "function":
        raise UnsupportedParameter(
            "only function tools (and namespaces of them) are supported", param=where
        )
    params.append(f"{where}.parameters")
    return make_tool(
        t.get("name"), t.get("description"), t.get("parameters"), where=where, params=params[-1]
    )


def parse_request(data: dict[str, Any]) -> Parsed:
    """A Responses body -> the internal chat request, and what the response echoes."""
    b = Body(data)
    model = model_field(b)
    if b.data.get("previous_response_id"):
        raise UnsupportedParameter(
            "Hearth's Responses API is stateless: send the whole conversation",
            param="previous_response_id",
        )
    tools, choice, namespaces = parse_tools(b)
    messages = parse_input(b)
    constraint, fmt = parse_text_format(b)
    max_tokens = b.integer("max_output_tokens", None, lo=1, hi=MAX_TOKENS_LIMIT)
    top_logprobs = parse_top_logprobs(b)
    sampling = SamplingParams(
        temperature=b.number("temperature", 1.0, lo=0.0, hi=2.0),
        top_p=b.number("top_p", 1.0, lo=0.0, hi=1.0),
    )
    req = ChatRequest(
        model=model,
        messages=tuple(messages),
        sampling=sampling,
        max_tokens=max_tokens,
        tools=tuple(tools),
        tool_choice=choice,
        constraint=constraint,
        template_vars=_template_vars(b),
        logprobs=parse_logprobs(b, top_logprobs),
        ttl=parse_ttl(b),
    )
    echo = Echo(
        b.text("instructions"),
        max_tokens,
        sampling.temperature,
        sampling.top_p,
        fmt,
        namespaces,
        top_logprobs,
    )
    return Parsed(req, b.flag("stream"), echo)


# -- rendering ---------------------------------------------------------------------------------
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
        "previous_response_id": None,
        "store": False,
        "temperature": echo.temperature,
        "top_p": echo.top_p,
        "top_logprobs": echo.top_logprobs,
        "text": {"format": echo.text_format},
        "tool_choice": "auto",
        "tools": [],
        "truncation": "disabled",
        "metadata": {},
        "usage": _usage(final) if final is not None else None,
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
    .incomplete at max_output_tokens). Every event carries the next ``sequence_number``."""

    def __init__(self, echo: Echo, ctx: Context) -> None:
        self.echo = echo
        self.ctx = ctx
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
        kind = "response.incomplete" if done["status"] == "incomplete" else "response.completed"
        return [self._event(kind, response=done)]

    def error(self, err: HearthError) -> list[Frame]:
        return [
            self._event("error", code=err.code or "server_error", message=err.message, param=None)
        ]
