"""OpenAI Responses, parsed: input items and instructions -> ChatRequest, plus what the
response echoes back of the request and what a stored response keeps (pure, no aiohttp).
Errors have OpenAI's shape (the route belongs to the OpenAI protocol).

A continuation (``previous_response_id``) gets the stored conversation as ``history``: its
items go before this request's ``input``; only this request's ``instructions`` apply, as
OpenAI specifies. ``store`` (default true) says whether the response is kept.

Logprobs, as OpenAI: ``include: ["message.output_text.logprobs"]`` turns them on and
``top_logprobs`` (0-20) says how many alternatives each token comes with (alone it changes
nothing).
Tested by tests/server/protocols/responses/test_adapter.py and
tests/server/protocols/test_image_parts.py.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from app.core.inference.images import neutralise_markers
from app.core.inference.tools import Tool
from app.core.requests import ChatRequest, ToolChoice
from app.core.types import ChatMessage, Constraint, SamplingParams, ToolCall
from app.errors import InvalidRequest, UnsupportedParameter
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
    tool_choice,
)
from app.server.protocols.fields_registry import OPENAI_RESPONSES, refuse_unhonoured
from app.server.protocols.openai.parse import model_field

TOOL_CHOICES = ("none", "auto", "required")
LOGPROBS_INCLUDE = "message.output_text.logprobs"  # the ``include`` entry that asks for them


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
    previous_response_id: str | None = None
    store: bool = True


@dataclass(frozen=True, slots=True)
class Parsed:
    request: ChatRequest
    stream: bool
    echo: Echo
    items: list[dict[str, Any]] = field(default_factory=list)  # ``input`` as items, with ids


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


def previous_response_id(data: dict[str, Any]) -> str | None:
    """The response a request continues (``previous_response_id``), or None."""
    return Body(data).text("previous_response_id") or None


_ITEM_PREFIX = {"message": "msg_", "function_call": "fc_", "function_call_output": "fco_"}


def input_items(b: Body) -> list[dict[str, Any]]:
    """``input`` as a list of items, each with an ``id`` (a string input is one user message),
    as a stored response lists them."""
    raw = b.data.get("input")
    if isinstance(raw, str):
        raw = [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": raw}]}
        ]
    if not isinstance(raw, list) or not raw:
        raise InvalidRequest(
            "'input' must be a string or a non-empty array of items", param="input"
        )
    items: list[dict[str, Any]] = []
    for i, item in enumerate(raw):
        if not isinstance(item, dict):
            raise InvalidRequest("input items must be objects", param=f"input[{i}]")
        if not isinstance(item.get("id"), str):
            prefix = _ITEM_PREFIX.get(item.get("type", "message"), "item_")
            item = {"id": prefix + uuid.uuid4().hex, **item}
        items.append(item)
    return items


def parse_input(
    b: Body, history: Sequence[dict[str, Any]] = (), items: Sequence[dict[str, Any]] | None = None
) -> list[ChatMessage]:
    """``instructions``, then the ``history`` items (a continued response's conversation),
    then ``input`` (``items``: it as :func:`input_items` made it) -> the chat's messages."""
    msgs: list[ChatMessage] = []
    instructions = b.text("instructions")
    if instructions:
        msgs.append(ChatMessage("system", neutralise_markers(instructions)))
    for i, item in enumerate([*history, *(input_items(b) if items is None else items)]):
        where = f"input[{i - len(history)}]" if i >= len(history) else "previous_response_id"
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


def parse_request(data: dict[str, Any], history: Sequence[dict[str, Any]] = ()) -> Parsed:
    """A Responses body -> the internal chat request, what the response echoes and this
    input's items; ``history``: the conversation of the response it continues."""
    refuse_unhonoured(data, OPENAI_RESPONSES)
    b = Body(data)
    model = model_field(b)
    tools, choice, namespaces = parse_tools(b)
    items = input_items(b)
    messages = parse_input(b, history, items)
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
        previous_response_id(data),
        b.flag("store", True),
    )
    return Parsed(req, b.flag("stream"), echo, items)
