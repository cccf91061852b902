"""OpenAI's own request fields (chat messages, prompts, embedding inputs, stream options,
logprobs, response_format, the features not implemented yet), on the shared validators.
Tested by tests/server/protocols/openai/test_adapter.py and
tests/server/protocols/openai/test_scoring_fields.py."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from app.core.inference.images import ImageSource
from app.core.requests import MAX_EMBED_INPUTS
from app.core.types import ChatMessage, Constraint, ToolCall
from app.errors import InvalidRequest, UnsupportedParameter
from app.server.protocols.common import (
    MAX_MESSAGES,
    ROLES,
    Body,
    parse_content,
    parse_logprobs_flag,
    parse_max_tokens,
    schema_constraint,
)

MAX_PROMPT_LOGPROBS = 20  # alternatives per prompt token (vLLM's default bound)


def parse_messages(b: Body) -> list[ChatMessage]:
    raw = b.data.get("messages")
    if raw is None:
        raise InvalidRequest("'messages' is required", param="messages")
    if not isinstance(raw, list) or not raw:
        raise InvalidRequest("'messages' must be a non-empty array", param="messages")
    if len(raw) > MAX_MESSAGES:
        raise InvalidRequest("too many messages", param="messages")
    out: list[ChatMessage] = []
    for i, m in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise InvalidRequest("each message must be an object", param=where)
        role = m.get("role")
        if not isinstance(role, str) or role not in ROLES:
            raise InvalidRequest(f"unknown role {role!r}", param=f"{where}.role")
        if role == "developer":  # OpenAI's newer name for the system role
            role = "system"
        content = m.get("content")
        tool_calls = m.get("tool_calls") or ()
        if tool_calls and (role != "assistant" or not isinstance(tool_calls, list)):
            raise InvalidRequest(
                "'tool_calls' must be an array on an assistant message", param=f"{where}.tool_calls"
            )
        images: tuple[ImageSource, ...] = ()
        if content is None:
            if role == "assistant" and (tool_calls or m.get("refusal") is not None):
                text = ""
            else:
                raise InvalidRequest("'content' is required", param=f"{where}.content")
        else:
            text, images = parse_content(content, f"{where}.content")
        name = m.get("name")
        if name is not None and not isinstance(name, str):
            raise InvalidRequest("'name' must be a string", param=f"{where}.name")
        tcid = m.get("tool_call_id")
        if role == "tool" and not isinstance(tcid, str):
            raise InvalidRequest(
                "a tool message needs 'tool_call_id'", param=f"{where}.tool_call_id"
            )
        out.append(
            ChatMessage(
                role=role,
                content=text,
                name=name,
                tool_calls=tuple(
                    openai_tool_call(tc, f"{where}.tool_calls[{j}]")
                    for j, tc in enumerate(tool_calls)
                ),
                tool_call_id=tcid if isinstance(tcid, str) else None,
                image_sources=images,
            )
        )
    return out


def openai_tool_call(tc: Any, where: str) -> ToolCall:
    """One assistant ``tool_calls`` entry in OpenAI's shape, typed."""
    fn = tc.get("function") if isinstance(tc, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise InvalidRequest("a tool call needs function.name", param=where)
    args = fn.get("arguments", "{}")
    if not isinstance(args, str):  # some clients send the object itself
        args = json.dumps(args)
    return ToolCall(str(tc.get("id") or ""), fn["name"], args)


@dataclass(frozen=True, slots=True)
class StreamOptions:
    stream: bool
    include_usage: bool


def parse_stream(b: Body) -> StreamOptions:
    stream = b.flag("stream")
    so = b.data.get("stream_options")
    include = False
    if so is not None:
        if not isinstance(so, dict):
            raise InvalidRequest("'stream_options' must be an object", param="stream_options")
        iu = so.get("include_usage")
        if iu is not None and not isinstance(iu, bool):
            raise InvalidRequest(
                "'include_usage' must be a boolean", param="stream_options.include_usage"
            )
        include = bool(iu)
    return StreamOptions(stream, include and stream)


def parse_prompt(b: Body) -> list[str | list[int]]:
    """`prompt` as a string, a list of strings, a list of token ids, or a list of those lists."""
    p = b.data.get("prompt")
    if p is None:
        raise InvalidRequest("'prompt' is required", param="prompt")
    if isinstance(p, str):
        return [p]
    if isinstance(p, list) and p:
        if all(isinstance(x, int) and not isinstance(x, bool) for x in p):
            return [list(p)]
        if all(isinstance(x, str) for x in p):
            return list(p)
        if all(
            isinstance(x, list)
            and x
            and all(isinstance(t, int) and not isinstance(t, bool) for t in x)
            for x in p
        ):
            return [list(x) for x in p]
    raise InvalidRequest(
        "'prompt' must be a string, an array of strings, an array of token ids, or an array of those",
        param="prompt",
    )


def parse_embedding_input(b: Body) -> list[str | list[int]]:
    """`input` as a string, a list of strings, a list of token ids, or a list of those lists."""
    v = b.data.get("input")
    if v is None:
        raise InvalidRequest("'input' is required", param="input")
    items: list[Any]
    if isinstance(v, str):
        items = [v]
    elif (
        isinstance(v, list) and v and all(isinstance(t, int) and not isinstance(t, bool) for t in v)
    ):
        items = [list(v)]
    elif isinstance(v, list) and v:
        items = v
    else:
        raise InvalidRequest("'input' must be a non-empty string or array", param="input")
    if len(items) > MAX_EMBED_INPUTS:
        raise InvalidRequest(f"at most {MAX_EMBED_INPUTS} inputs per request", param="input")
    out: list[str | list[int]] = []
    for i, item in enumerate(items):
        if isinstance(item, str):
            if not item:
                raise InvalidRequest("an input is an empty string", param=f"input[{i}]")
            out.append(item)
        elif (
            isinstance(item, list)
            and item
            and all(isinstance(t, int) and not isinstance(t, bool) for t in item)
        ):
            out.append(list(item))
        else:
            raise InvalidRequest(
                "each input must be a string or an array of token ids", param=f"input[{i}]"
            )
    return out


def parse_logprobs(b: Body, *, chat: bool) -> int | None:
    """Chat: `logprobs` true + `top_logprobs` 0-20. Legacy completions: `logprobs` 0-5."""
    if chat:
        return parse_logprobs_flag(b)
    return b.integer("logprobs", None, lo=0, hi=5)


def parse_prompt_logprobs(b: Body, stream: bool) -> int | None:
    """vLLM's ``prompt_logprobs``: each prompt token's log-probability and the N (0-20) most
    likely tokens at its place. Not streamed (as vLLM): the whole prompt comes at once."""
    n = b.integer("prompt_logprobs", None, lo=0, hi=MAX_PROMPT_LOGPROBS)
    if n is not None and stream:
        raise UnsupportedParameter(
            "'prompt_logprobs' is not available when streaming; ask without 'stream'",
            param="prompt_logprobs",
        )
    return n


def parse_completion_max_tokens(b: Body, echo: bool) -> int | None:
    """``max_tokens`` of a legacy completion: 0 with ``echo`` scores the prompt only (as
    OpenAI's legacy endpoint and vLLM take it); absent, OpenAI's default of 16."""
    v = b.data.get("max_tokens")
    if echo and not b.has("max_completion_tokens") and v == 0 and not isinstance(v, bool):
        return 0
    max_tokens = parse_max_tokens(b)
    if max_tokens is None and not b.has("max_tokens"):
        max_tokens = 16
    return max_tokens


def parse_response_format(b: Body) -> Constraint | None:
    """`response_format`: text | json_object | json_schema (bounded in size and depth)."""
    rf = b.data.get("response_format")
    if rf is None:
        return None
    if not isinstance(rf, dict) or not isinstance(rf.get("type"), str):
        raise InvalidRequest(
            "'response_format' must be an object with a 'type'", param="response_format"
        )
    kind = rf["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        return Constraint("json_object")
    if kind != "json_schema":
        raise InvalidRequest(f"unknown response_format type {kind!r}", param="response_format.type")
    js = rf.get("json_schema")
    if not isinstance(js, dict) or not isinstance(js.get("schema", {}), dict):
        raise InvalidRequest(
            "'json_schema' must be an object with a 'schema' object",
            param="response_format.json_schema",
        )
    return schema_constraint(js.get("schema") or {}, param="response_format.json_schema.schema")
