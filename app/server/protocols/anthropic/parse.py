"""Anthropic Messages, parsed: body -> ChatRequest (messages, content blocks and their images,
tools and tool choice), pure (no aiohttp).

The route in ``app/server/routes/anthropic.py`` hands the body here and writes what render.py
makes of the results through the one streaming path.
Tested by tests/server/protocols/anthropic/test_adapter.py and
tests/server/protocols/test_image_parts.py.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from app.core.inference.images import IMAGE_MARKER, ImageSource, InvalidImage, neutralise_markers
from app.core.inference.tools import Tool
from app.core.requests import ChatRequest, ToolChoice
from app.core.types import ChatMessage, SamplingParams, ToolCall
from app.errors import InvalidRequest, UnsupportedParameter
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
from app.server.protocols.fields_registry import (
    ANTHROPIC_COUNT_TOKENS,
    ANTHROPIC_MESSAGES,
    refuse_unhonoured,
)


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
    refuse_unhonoured(data, ANTHROPIC_COUNT_TOKENS if counting else ANTHROPIC_MESSAGES)
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
        template_vars=thinking_vars(b),
    )
    return Parsed(req, b.flag("stream"))


def thinking_vars(b: Body) -> dict[str, Any]:
    """``thinking`` ({"type": "enabled" | "disabled" | "adaptive"}) and ``output_config.effort``
    as the chat template reads them: ``enable_thinking`` (Qwen3-style templates) and
    ``reasoning_effort`` (gpt-oss); a model without such a switch thinks as it does."""
    out: dict[str, Any] = {}
    effort = b.data.get("output_config")
    if effort is not None:
        effort = effort.get("effort") if isinstance(effort, dict) else "?"
        if effort is not None and effort not in ("low", "medium", "high"):
            raise InvalidRequest(
                "'output_config.effort' must be low, medium or high", param="output_config.effort"
            )
        if effort is not None:
            out["reasoning_effort"] = effort  # gpt-oss templates read it
    raw = b.data.get("thinking")
    if raw is None:
        return out
    kind = raw.get("type") if isinstance(raw, dict) else None
    if kind not in ("enabled", "disabled", "adaptive"):
        raise InvalidRequest(
            "'thinking' must be an object with type enabled, disabled or adaptive",
            param="thinking.type",
        )
    if kind != "adaptive":
        out["enable_thinking"] = kind == "enabled"
    return out
