"""Ollama's API (/api/chat, /api/generate, /api/embed, /api/embeddings), parsed: bodies ->
requests. Pure (no aiohttp); the routes in ``app/server/routes/ollama.py`` hand the bodies here
and write what ``render.py`` makes of the results through the one streaming path. The model
listings (/api/tags, /api/show, /api/ps) are in ``models.py``.

``format``, ``tools`` and ``think`` map onto the core every protocol uses:

- ``format``: ``"json"`` is a ``json_object`` constraint; a JSON schema object is ``json_schema``
  (enforced by grammar; a schema that cannot compile is a 400).
- ``tools`` (/api/chat only): ``auto`` unless the body carries Hearth's ``tool_choice``
  extension (OpenAI's spellings: none / auto / required / a named function; Ollama's own API
  has no tool choice) and ``parallel_tool_calls``. A call comes back
  whole, as Ollama sends it: ``{"id", "function": {"index", "name", "arguments": {object}}}``, in
  the stream as soon as its arguments are whole. History may carry assistant ``tool_calls`` with
  object arguments and ``tool`` messages with ``tool_name``.
- ``think``: reasoning (``<think>`` blocks) goes to ``message.thinking`` (/api/chat) or
  ``thinking`` (/api/generate). When ``think`` is absent it is separated too: Ollama defaults
  ``think`` to true for models that can think, and a model that cannot writes no reasoning.
  ``"low"``/``"medium"``/``"high"`` (gpt-oss levels) count as true. ``think`` is also given to
  the chat template (``enable_thinking``, and ``reasoning_effort`` for a level), so Qwen3-style
  templates switch thinking off for ``think: false``; reasoning that a model writes anyway
  stays in ``content`` inside ``<think>…</think>``, as Ollama shows it, rather than being
  dropped. A ``raw`` /api/generate is never parsed for reasoning; ``format`` applies to it too.
- ``logprobs`` / ``top_logprobs`` (0-20): each token's log-probability and that many likely
  alternatives, as Ollama (0.12.11+) writes them: a top-level ``logprobs`` list on each line for
  its tokens (a line with no text carries the logprobs of text still held back), the whole list
  in a ``"stream": false`` answer, and no field at all when they are off.
Tested by tests/server/protocols/ollama/test_adapter.py and
tests/server/protocols/test_image_parts.py.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from app.core.engine.keep_alive import parse_keep_alive
from app.core.inference.images import ImageSource, marked_text, neutralise_markers
from app.core.requests import (
    MAX_EMBED_INPUTS,
    ChatRequest,
    CompletionRequest,
    EmbeddingRequest,
    Infill,
)
from app.core.types import UNSET, ChatMessage, Constraint, SamplingParams, ToolCall
from app.errors import InvalidRequest, UnsupportedParameter
from app.server.protocols.common import (
    MAX_MESSAGES,
    MAX_TOKENS_LIMIT,
    ROLES,
    Body,
    _content_text,
    b64_image,
    check_stop,
    parse_logprobs_flag,
    parse_tools,
    schema_constraint,
)
from app.server.protocols.fields_registry import (
    OLLAMA_CHAT,
    OLLAMA_EMBED,
    OLLAMA_GENERATE,
    OLLAMA_OPTIONS,
    refuse_unhonoured,
)

THINK_LEVELS = ("low", "medium", "high")
Key = Literal["message", "response"]  # where the output goes: /api/chat, /api/generate
Resolve = Callable[[str], str]  # an Ollama model name ("x:latest") -> the library id


@dataclass(frozen=True, slots=True)
class Parsed:
    """An /api/chat or /api/generate body. ``request`` None: the prompt/messages were empty,
    which loads the model (or unloads it with ``keep_alive: 0``)."""

    model: str  # the library id
    request: ChatRequest | CompletionRequest | None
    key: Key
    stream: bool
    think: bool
    ttl: Any


def parse_options(raw: Any) -> tuple[SamplingParams, int | None, tuple[str, ...]]:
    """``options`` with Ollama's defaults (temperature 0.8, top_k 40, top_p 0.9, repeat_penalty
    1.1): the sampling, ``num_predict`` (negative: no limit) and ``stop`` (bounded as on every
    protocol)."""
    if not isinstance(raw, dict):
        raise InvalidRequest("'options' must be an object", param="options")
    refuse_unhonoured(raw, OLLAMA_OPTIONS, prefix="options.")
    b = Body(raw)
    sampling = SamplingParams(
        temperature=b.number("temperature", 0.8, lo=0.0, hi=2.0),
        top_p=b.number("top_p", 0.9, lo=0.0, hi=1.0),
        top_k=b.integer("top_k", 40, lo=0, hi=1_000_000) or 0,
        min_p=b.number("min_p", 0.0, lo=0.0, hi=1.0),
        repeat_penalty=b.number("repeat_penalty", 1.1, lo=0.01, hi=10.0),
        presence_penalty=b.number("presence_penalty", 0.0, lo=-2.0, hi=2.0),
        frequency_penalty=b.number("frequency_penalty", 0.0, lo=-2.0, hi=2.0),
        seed=b.integer("seed", None, lo=-(1 << 63), hi=(1 << 64) - 1),
    )
    n = b.integer("num_predict", None, lo=-2, hi=MAX_TOKENS_LIMIT)
    if n == 0:
        raise InvalidRequest("'num_predict' must not be 0", param="options.num_predict")
    max_tokens = None if n is None or n < 0 else n
    return sampling, max_tokens, check_stop(raw.get("stop"), "options.stop")


def parse_format(b: Body) -> Constraint | None:
    """``format``: "json" (any JSON) or a JSON schema object, as a generation constraint."""
    fmt = b.data.get("format")
    if fmt is None or fmt == "":
        return None
    if fmt == "json":
        return Constraint("json_object")
    if isinstance(fmt, dict):
        return schema_constraint(fmt, param="format")
    raise InvalidRequest("'format' must be \"json\" or a JSON schema object", param="format")


def parse_think(b: Body) -> bool:
    """``think``: absent or true separates the reasoning; see the module docstring."""
    v = b.data.get("think")
    if v is None or v is True or v in THINK_LEVELS:
        return True
    if v is False:
        return False
    raise InvalidRequest('\'think\' must be true, false, "low", "medium" or "high"', param="think")


def think_vars(b: Body) -> dict[str, Any]:
    """What ``think`` tells the chat template: ``enable_thinking`` (Qwen3-style templates) and,
    for a level, ``reasoning_effort`` (gpt-oss templates)."""
    v = b.data.get("think")
    if isinstance(v, bool):
        return {"enable_thinking": v}
    if v in THINK_LEVELS:
        return {"enable_thinking": True, "reasoning_effort": v}
    return {}


def parse_ttl(b: Body) -> Any:
    v = b.data.get("keep_alive")
    return UNSET if v is None else parse_keep_alive(v)


def _images(raw: Any, where: str) -> tuple[ImageSource, ...]:
    """Ollama's ``images``: a list of base64 strings (the images come before the text)."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise InvalidRequest("'images' must be an array of base64 strings", param=where)
    return tuple(
        ImageSource(f"{where}[{k}]", data=b64_image(v, f"{where}[{k}]")) for k, v in enumerate(raw)
    )


def _model(b: Body, resolve: Resolve) -> str:
    return resolve(b.text("model", required=True) or "")


def _history_call(c: Any, where: str, default_id: str) -> ToolCall:
    """An assistant ``tool_calls`` entry: Ollama's (object arguments, often no id) or OpenAI's."""
    fn = c.get("function") if isinstance(c, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise InvalidRequest("a tool call needs a function with a name", param=where)
    args = fn.get("arguments")
    cid = c.get("id")
    return ToolCall(
        cid if isinstance(cid, str) and cid else default_id,
        fn["name"],
        args if isinstance(args, str) else json.dumps(args or {}),
    )


def parse_history(raw: Any) -> list[ChatMessage]:
    """Ollama ``messages`` as typed history. A ``tool`` message (``tool_name``, and
    ``tool_call_id`` in newer clients) answers the earliest unanswered call of that name;
    ``thinking`` of earlier turns is not given back to the model."""
    if not isinstance(raw, list) or not raw:
        raise InvalidRequest("'messages' must be a non-empty array", param="messages")
    if len(raw) > MAX_MESSAGES:
        raise InvalidRequest("too many messages", param="messages")
    out: list[ChatMessage] = []
    pending: list[ToolCall] = []  # calls not answered yet
    for i, m in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise InvalidRequest("each message must be an object", param=where)
        images = _images(m.get("images"), f"{where}.images")
        role = m.get("role")
        if not isinstance(role, str) or role not in ROLES:
            raise InvalidRequest(f"unknown role {role!r}", param=f"{where}.role")
        role = "system" if role == "developer" else role
        raw_calls = m.get("tool_calls") or []
        if raw_calls and (role != "assistant" or not isinstance(raw_calls, list)):
            raise InvalidRequest(
                "'tool_calls' must be an array on an assistant message", param=f"{where}.tool_calls"
            )
        calls = tuple(
            _history_call(c, f"{where}.tool_calls[{j}]", f"call_{i}_{j}")
            for j, c in enumerate(raw_calls)
        )
        pending.extend(calls)
        content = m.get("content")
        if content is None:
            if not (role == "assistant" and calls):
                raise InvalidRequest("'content' is required", param=f"{where}.content")
            content = ""
        name = m.get("name")
        if role == "tool" and isinstance(m.get("tool_name"), str) and m["tool_name"]:
            name = m["tool_name"]
        if name is not None and not isinstance(name, str):
            raise InvalidRequest("'name' must be a string", param=f"{where}.name")
        call_id = None
        if role == "tool":
            call_id = m.get("tool_call_id")
            if not isinstance(call_id, str):
                match = next((c for c in pending if name is None or c.name == name), None)
                call_id = match.id if match else f"call_{i}"
            pending = [c for c in pending if c.id != call_id]
        out.append(
            ChatMessage(
                role,
                marked_text(_content_text(content, f"{where}.content"), len(images)),
                name=name,
                tool_calls=calls,
                tool_call_id=call_id,
                image_sources=images,
            )
        )
    return out


def parse_chat(data: dict[str, Any], resolve: Resolve) -> Parsed:
    """An /api/chat body (``resolve`` turns its model name into the library id)."""
    b = Body(data)
    model = _model(b, resolve)
    refuse_unhonoured(data, OLLAMA_CHAT)
    constraint, think = parse_format(b), parse_think(b)
    # tools: Ollama's shape is OpenAI's; `tool_choice` / `parallel_tool_calls` are Hearth's
    # extension here (Ollama's API has none: auto is the default), in OpenAI's spellings
    tools, choice = parse_tools(b)
    logprobs = parse_logprobs_flag(b, zero_alone=True)
    ttl = parse_ttl(b)
    stream = b.flag("stream", True)
    if not b.data.get("messages"):
        return Parsed(model, None, "message", stream, think, ttl)
    messages = parse_history(b.data["messages"])
    sampling, max_tokens, stop = parse_options(b.data.get("options") or {})
    req = ChatRequest(
        model=model,
        messages=tuple(messages),
        sampling=sampling,
        max_tokens=max_tokens,
        stop=stop,
        tools=tuple(tools),
        tool_choice=choice,
        constraint=constraint,
        template_vars=think_vars(b),
        logprobs=logprobs,
        ttl=ttl,
    )
    return Parsed(model, req, "message", stream, think, ttl)


def parse_generate(data: dict[str, Any], resolve: Resolve) -> Parsed:
    """An /api/generate body: the model's template applied to ``system`` + ``prompt`` (a chat
    request), or with ``raw`` the prompt as it is (a completion, never parsed for reasoning)."""
    b = Body(data)
    model = _model(b, resolve)
    refuse_unhonoured(data, OLLAMA_GENERATE)
    constraint, think = parse_format(b), parse_think(b)
    logprobs = parse_logprobs_flag(b, zero_alone=True)
    ttl = parse_ttl(b)
    stream = b.flag("stream", True)
    prompt = b.text("prompt", default="") or ""
    if not prompt:
        return Parsed(model, None, "response", stream, think, ttl)
    raw = b.flag("raw")
    images = _images(b.data.get("images"), "images")
    if raw and images:
        raise UnsupportedParameter(
            "'images' need the model's template; not with raw", param="images"
        )
    infill = _suffix(b, raw, images)
    sampling, max_tokens, stop = parse_options(b.data.get("options") or {})
    req: ChatRequest | CompletionRequest
    if raw or infill is not None:
        req = CompletionRequest(
            model=model,
            prompts=(prompt,),
            sampling=sampling,
            max_tokens=max_tokens,
            stop=stop,
            constraint=constraint,
            logprobs=logprobs,
            ttl=ttl,
            infill=infill,
        )
    else:
        system = b.text("system")
        messages = (ChatMessage("system", neutralise_markers(system)),) if system else ()
        user = ChatMessage("user", marked_text(prompt, len(images)), image_sources=images)
        req = ChatRequest(
            model=model,
            messages=(*messages, user),
            sampling=sampling,
            max_tokens=max_tokens,
            stop=stop,
            constraint=constraint,
            template_vars=think_vars(b),
            logprobs=logprobs,
            ttl=ttl,
        )
    return Parsed(model, req, "response", stream, think, ttl)


def _suffix(b: Body, raw: bool, images: tuple[Any, ...]) -> Infill | None:
    """Ollama's insert: ``prompt`` before the completion, ``suffix`` after it, built from the
    model's FIM tokens. What Ollama would drop beside it is refused instead: ``raw`` (Ollama
    then sends the prompt alone), ``system`` and ``images`` (its suffix template has neither)."""
    suffix = b.text("suffix")
    if not suffix:
        return None
    for key, given in (("raw", raw), ("system", bool(b.text("system"))), ("images", images)):
        if given:
            raise UnsupportedParameter(
                f"'{key}' is not taken with 'suffix': the fill-in-the-middle prompt is built "
                "from the model's own tokens around the prompt and the suffix",
                param=key,
            )
    return Infill(suffix=suffix)


def parse_embed(data: dict[str, Any], resolve: Resolve) -> EmbeddingRequest:
    """/api/embed: ``input`` a non-empty string or list of them (at most MAX_EMBED_INPUTS)."""
    b = Body(data)
    model = _model(b, resolve)
    refuse_unhonoured(data, OLLAMA_EMBED)
    raw = b.data.get("input")
    items = [raw] if isinstance(raw, str) else raw
    if not isinstance(items, list) or not items or not all(isinstance(x, str) and x for x in items):
        raise InvalidRequest("'input' must be a non-empty string or list of strings", param="input")
    if len(items) > MAX_EMBED_INPUTS:  # refused before the model loads
        raise InvalidRequest(f"at most {MAX_EMBED_INPUTS} inputs per request", param="input")
    return EmbeddingRequest(
        model=model,
        inputs=tuple(items),
        ttl=parse_ttl(b),
        dimensions=b.integer("dimensions", None, lo=1, hi=1 << 16),
    )


def parse_embeddings_legacy(data: dict[str, Any], resolve: Resolve) -> EmbeddingRequest:
    """/api/embeddings: one ``prompt``."""
    b = Body(data)
    model = _model(b, resolve)
    prompt = b.text("prompt", required=True) or ""
    if not prompt:
        raise InvalidRequest("'prompt' must not be empty", param="prompt")
    return EmbeddingRequest(model=model, inputs=(prompt,), ttl=parse_ttl(b))
