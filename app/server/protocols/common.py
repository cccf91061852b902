"""Request parsing and validation at the edge: JSON bodies -> core types, with 400s naming the param.
Tested by tests/server/protocols/ollama/test_adapter.py."""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
from collections.abc import Sequence
from typing import Any

from app.core.engine.keep_alive import parse_keep_alive
from app.core.inference.constraints import (
    MAX_SCHEMA_DEPTH,
    check_schema,
    check_schemas,
    json_depth,
    schema_json,
)
from app.core.inference.images import IMAGE_MARKER, ImageSource, InvalidImage, neutralise_markers
from app.core.inference.tools import Tool
from app.core.requests import UNSET, ToolChoice
from app.core.types import Constraint, Delta, SamplingParams, TokenLogprob
from app.core.util import jsonsafe
from app.errors import InvalidRequest, UnsupportedParameter

MAX_TOKENS_LIMIT = 1 << 20
MAX_STOP = 16
MAX_STOP_LEN = 1024
MAX_MESSAGES = 100_000
MAX_N = 16
MAX_TOP_LOGPROBS = 20  # the most alternatives a token's logprob comes with, on every protocol
ROLES = {"system", "developer", "user", "assistant", "tool", "function"}


def _reject_constant(name: str) -> Any:
    raise InvalidRequest(
        f"invalid JSON number {name}: NaN and Infinity are not allowed", param=None
    )


def parse_json(raw: bytes) -> dict[str, Any]:
    """Parse a request body: an object, no NaN/Infinity, bounded nesting."""
    if not raw.strip():
        raise InvalidRequest("the request body is empty; expected a JSON object")
    try:
        data = jsonsafe.fast_loads(raw, parse_constant=_reject_constant)
    except InvalidRequest:
        raise
    except RecursionError as e:
        raise InvalidRequest("the JSON body is nested too deeply") from e
    except (ValueError, UnicodeDecodeError) as e:
        raise InvalidRequest(f"the body is not valid JSON: {e}") from e
    if not isinstance(data, dict):
        raise InvalidRequest("the body must be a JSON object")
    if _SURROGATE_ESCAPE.search(raw):
        _reject_lone_surrogates(data)
    return data


# JSON can spell a lone UTF-16 surrogate (\ud800), which is not text: no encoder, tokenizer or
# client can take it. Only bodies that contain such an escape are walked.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def _reject_lone_surrogates(data: Any) -> None:
    stack: list[tuple[Any, str]] = [(data, "")]
    while stack:
        node, path = stack.pop()
        if isinstance(node, str):
            if _LONE_SURROGATE.search(node):
                raise InvalidRequest(
                    "a string holds a lone UTF-16 surrogate (such as \\ud800), which is not "
                    "valid Unicode text",
                    param=path or None,
                )
        elif isinstance(node, dict):
            for k, v in node.items():
                stack.append((k, path))
                stack.append((v, f"{path}.{k}" if path else str(k)))
        elif isinstance(node, list):
            stack.extend((v, f"{path}[{i}]") for i, v in enumerate(node))


class Body:
    """Typed, validated access to a JSON object's fields."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data

    def has(self, key: str) -> bool:
        return self.data.get(key) is not None

    def text(self, key: str, *, required: bool = False, default: str | None = None) -> str | None:
        v = self.data.get(key)
        if v is None:
            if required:
                raise InvalidRequest(f"'{key}' is required", param=key)
            return default
        if not isinstance(v, str):
            raise InvalidRequest(f"'{key}' must be a string", param=key)
        return v

    def flag(self, key: str, default: bool = False) -> bool:
        v = self.data.get(key)
        if v is None:
            return default
        if not isinstance(v, bool):
            raise InvalidRequest(f"'{key}' must be a boolean", param=key)
        return v

    def number(self, key: str, default: float, *, lo: float, hi: float) -> float:
        v = self.data.get(key)
        if v is None:
            return default
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            raise InvalidRequest(f"'{key}' must be a number", param=key)
        if not lo <= v <= hi:
            raise InvalidRequest(f"'{key}' must be between {lo} and {hi}", param=key)
        return float(v)

    def integer(self, key: str, default: int | None, *, lo: int, hi: int) -> int | None:
        v = self.data.get(key)
        if v is None:
            return default
        if isinstance(v, bool) or not isinstance(v, int):
            if isinstance(v, float) and v.is_integer():
                v = int(v)
            else:
                raise InvalidRequest(f"'{key}' must be an integer", param=key)
        if not lo <= v <= hi:
            raise InvalidRequest(f"'{key}' must be between {lo} and {hi}", param=key)
        return v


def parse_sampling(b: Body) -> SamplingParams:
    repeat = b.number("repeat_penalty", 1.0, lo=0.0, hi=10.0)
    if b.has("repetition_penalty"):
        repeat = b.number("repetition_penalty", 1.0, lo=0.0, hi=10.0)
    if repeat <= 0:
        raise InvalidRequest("'repeat_penalty' must be greater than 0", param="repeat_penalty")
    return SamplingParams(
        temperature=b.number("temperature", 1.0, lo=0.0, hi=2.0),
        top_p=b.number("top_p", 1.0, lo=0.0, hi=1.0),
        top_k=b.integer("top_k", 0, lo=0, hi=1_000_000) or 0,
        min_p=b.number("min_p", 0.0, lo=0.0, hi=1.0),
        repeat_penalty=repeat,
        presence_penalty=b.number("presence_penalty", 0.0, lo=-2.0, hi=2.0),
        frequency_penalty=b.number("frequency_penalty", 0.0, lo=-2.0, hi=2.0),
        seed=b.integer("seed", None, lo=-(1 << 63), hi=(1 << 64) - 1),
        logit_bias=parse_logit_bias(b),
    )


MAX_LOGIT_BIAS = 1024


def parse_logit_bias(b: Body) -> tuple[tuple[int, float], ...]:
    """{"token id": bias in [-100, 100]}; ids are checked against the vocabulary later."""
    raw = b.data.get("logit_bias")
    if raw is None:
        return ()
    if not isinstance(raw, dict):
        raise InvalidRequest(
            "'logit_bias' must be an object of token id -> bias", param="logit_bias"
        )
    if len(raw) > MAX_LOGIT_BIAS:
        raise InvalidRequest(
            f"'logit_bias' takes at most {MAX_LOGIT_BIAS} entries", param="logit_bias"
        )
    out = []
    for k, v in raw.items():
        try:
            tok = int(k)
        except (TypeError, ValueError):
            raise InvalidRequest(
                f"logit_bias key {k!r} is not a token id", param="logit_bias"
            ) from None
        if (
            isinstance(v, bool)
            or not isinstance(v, int | float)
            or not math.isfinite(v)
            or not -100 <= v <= 100
        ):
            raise InvalidRequest(
                "logit_bias values must be numbers in [-100, 100]", param="logit_bias"
            )
        if tok < 0:
            raise InvalidRequest(f"token id {tok} is out of the vocabulary", param="logit_bias")
        out.append((tok, float(v)))
    return tuple(out)


def check_stop(v: Any, param: str) -> tuple[str, ...]:
    """Stop strings (one string or a list), bounded the same for every protocol."""
    if v is None:
        return ()
    items = [v] if isinstance(v, str) else v
    if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
        raise InvalidRequest(f"'{param}' must be a string or a list of strings", param=param)
    if len(items) > MAX_STOP:
        raise InvalidRequest(f"'{param}' takes at most {MAX_STOP} strings", param=param)
    if any(len(s) > MAX_STOP_LEN for s in items):
        raise InvalidRequest(
            f"each stop string must be at most {MAX_STOP_LEN} characters", param=param
        )
    return tuple(s for s in items if s)


def parse_stop(b: Body) -> tuple[str, ...]:
    return check_stop(b.data.get("stop"), "stop")


def parse_max_tokens(b: Body) -> int | None:
    # max_completion_tokens wins over the deprecated max_tokens
    for key in ("max_completion_tokens", "max_tokens"):
        if b.has(key):
            return b.integer(key, None, lo=1, hi=MAX_TOKENS_LIMIT)
    return None


def _content_text(content: Any, where: str) -> str:
    """A message's text, where no image may come (an image part here is a 400)."""
    text, images = parse_content(content, where)
    if images:
        raise UnsupportedParameter("an image is not taken here", param=images[0].where)
    return text


def parse_content(content: Any, where: str) -> tuple[str, tuple[ImageSource, ...]]:
    """A message's content (a string or parts) as text with IMAGE_MARKER where each image goes,
    and the images in order. Literal markers in the text are neutralised."""
    if isinstance(content, str):
        return neutralise_markers(content), ()
    if not isinstance(content, list):
        raise InvalidRequest("content must be a string or an array of content parts", param=where)
    parts: list[str] = []
    images: list[ImageSource] = []
    for j, part in enumerate(content):
        if isinstance(part, str):
            parts.append(neutralise_markers(part))
            continue
        pwhere = f"{where}[{j}]"
        if not isinstance(part, dict):
            raise InvalidRequest("content parts must be objects", param=pwhere)
        ptype = part.get("type")
        if ptype in ("text", "input_text", "output_text"):
            text = part.get("text")
            if not isinstance(text, str):
                raise InvalidRequest("a text part needs a string 'text'", param=f"{pwhere}.text")
            parts.append(neutralise_markers(text))
        elif ptype == "image_url":
            images.append(openai_image(part, pwhere))
            parts.append(IMAGE_MARKER)
        elif ptype == "input_image":
            images.append(responses_image(part, pwhere))
            parts.append(IMAGE_MARKER)
        elif ptype in ("input_audio", "file", "input_file"):
            raise UnsupportedParameter(
                f"content part type '{ptype}' needs an audio or file model; none is available",
                param=pwhere,
            )
        else:
            raise InvalidRequest(f"unknown content part type {ptype!r}", param=f"{pwhere}.type")
    return "".join(parts), tuple(images)


_DATA_URL = re.compile(r"^data:([\w.+/-]*)((?:;[\w.+-]+=[^;,]*)*)(;base64)?,", re.ASCII)


def image_from_url(url: Any, where: str) -> ImageSource:
    """An image URL: a base64 data URL (decoded here) or an http(s) URL (fetched later, under
    the server's URL policy)."""
    if not isinstance(url, str) or not url:
        raise InvalidImage("an image needs a URL string", param=where)
    if url[:5].lower() == "data:":
        m = _DATA_URL.match(url)
        if m is None or not m.group(3):
            raise InvalidImage(
                "an image data URL must be base64 (data:image/...;base64,...)", param=where
            )
        return ImageSource(where, data=b64_image(url[m.end() :], where))
    scheme = url.split(":", 1)[0].lower()
    if scheme not in ("http", "https") or len(url) > MAX_URL_LEN:
        raise InvalidImage("an image URL must be a data URL or an http(s) URL", param=where)
    return ImageSource(where, url=url)


MAX_URL_LEN = 8192


def b64_image(text: Any, where: str) -> bytes:
    """Strict base64 (whitespace allowed), as every protocol sends image bytes."""
    if not isinstance(text, str):
        raise InvalidImage("image data must be a base64 string", param=where)
    try:
        return base64.b64decode("".join(text.split()), validate=True)
    except (binascii.Error, ValueError):
        raise InvalidImage("image data is not valid base64", param=where) from None


def openai_image(part: dict[str, Any], where: str) -> ImageSource:
    """``{"type": "image_url", "image_url": {"url", "detail"}}`` (or ``image_url`` a string)."""
    iu = part.get("image_url")
    if isinstance(iu, dict):
        detail = iu.get("detail")
        if detail is not None and detail not in ("auto", "low", "high"):
            raise InvalidImage(
                "'detail' must be auto, low or high", param=f"{where}.image_url.detail"
            )
        return image_from_url(iu.get("url"), f"{where}.image_url.url")
    return image_from_url(iu, f"{where}.image_url")


def responses_image(part: dict[str, Any], where: str) -> ImageSource:
    """Responses ``{"type": "input_image", "image_url": URL, "detail"}``; ``file_id`` is a 400."""
    if part.get("file_id") is not None:
        raise UnsupportedParameter(
            "input_image file_id is not supported (there is no file store); send image_url",
            param=f"{where}.file_id",
        )
    url = part.get("image_url")
    if isinstance(url, dict):  # some clients nest it as chat completions does
        url = url.get("url")
    return image_from_url(url, f"{where}.image_url")


MAX_TOKENIZE_BYTES = 4 * 1024 * 1024  # a few seconds of tokenizer time, off the event loop
MAX_PIECES = 262_144  # tokens /tokenize spells out one by one (with_pieces)


def parse_ttl(b: Body) -> Any:
    """Hearth's `ttl` extension (seconds; -1 = never) or Ollama's `keep_alive` ("5m", 0, -1)."""
    for key in ("ttl", "keep_alive"):
        if b.data.get(key) is not None:
            return parse_keep_alive(b.data[key], param=key)
    return UNSET


PRIORITY_LIMIT = 1 << 31  # vLLM's priority is any integer: int32's range bounds it here


def parse_priority(b: Body) -> int:
    """vLLM's ``priority``: an integer, lower is served first, default 0 (a request with a
    negative one is also read before others' long prompts, as an editor's completion is)."""
    return b.integer("priority", 0, lo=-PRIORITY_LIMIT, hi=PRIORITY_LIMIT - 1) or 0


def schema_constraint(schema: dict[str, Any], *, param: str) -> Constraint:
    """A JSON schema as a ``("json_schema", JSON)`` constraint, through the bounded validator
    (app/core/inference/constraints.py; the runtime compiles it, and answers 400 if it cannot). Shared by
    OpenAI's ``response_format``, Responses' ``text.format`` and Ollama's ``format``."""
    return Constraint("json_schema", check_schema(schema, param=param))


MAX_TOOLS = 128
_TOOL_NAME = re.compile(r"^[a-zA-Z0-9_.-]{1,64}$")


def check_tool_count(raw: Any) -> list[Any]:
    """``tools`` as a list of at most MAX_TOOLS entries (every protocol's tool list)."""
    if raw is None:
        return []
    if not isinstance(raw, list) or len(raw) > MAX_TOOLS:
        raise InvalidRequest(
            f"'tools' must be an array of at most {MAX_TOOLS} tools", param="tools"
        )
    return raw


def tool_parameters(raw: Any, *, param: str) -> dict[str, Any]:
    """A tool's parameter schema (absent: no parameters), bounded in depth and size. Rendered
    into the prompt as it is; only a forced call compiles it (see :func:`check_forced_tools`)."""
    params = raw or {"type": "object", "properties": {}}
    schema_json(params, param=param)  # an object once this passes
    return dict(params)


def check_forced_tools(tools: list[Tool], choice: str, params: list[str]) -> None:
    """A forced call (``required``, or a named tool) enforces the chosen tools' parameter schemas
    as one grammar: bound them together, like a ``response_format`` schema. ``params[i]`` names
    ``tools[i]``'s schema in the request."""
    if choice in ("none", "auto"):
        return
    check_schemas(
        (t.parameters, where)
        for t, where in zip(tools, params, strict=True)
        if choice == "required" or t.name == choice
    )


_OPENAI_PARAMS = "tools[{}].function.parameters"


def make_tool(name: Any, description: Any, parameters: Any, *, where: str, params: str) -> Tool:
    """One tool, whatever protocol described it: a valid name, a text description, and a
    parameter schema bounded in depth and size (``params`` names the schema in the request)."""
    if not isinstance(name, str) or not _TOOL_NAME.match(name):
        raise InvalidRequest(
            "each tool needs a name of 1-64 letters, digits, '_', '.' or '-'", param=where
        )
    if description is not None and not isinstance(description, str):
        raise InvalidRequest("a tool's description must be a string", param=where)
    return Tool(name, description or "", tool_parameters(parameters, param=params))


def tool_choice(
    choice: str, tools: list[Tool], params: list[str], *, parallel: bool, param: str
) -> ToolChoice:
    """The one tool-choice check of every protocol: ``choice`` is "none" | "auto" | "required"
    | a tool's name (each adapter maps its own spelling onto these). A forced choice needs
    tools, a named one must be among them, and the schemas it will enforce are bounded
    together (``params[i]`` names ``tools[i]``'s schema)."""
    if choice not in ("none", "auto") and not tools:
        raise InvalidRequest(f"'{param}' needs tools", param=param)
    if choice not in ("none", "auto", "required") and choice not in {t.name for t in tools}:
        raise InvalidRequest(
            f"'{param}' names '{choice}', which is not one of the tools", param=param
        )
    check_forced_tools(tools, choice, params)
    if choice in ("none", "auto", "required"):
        return ToolChoice(choice, None, parallel)  # type: ignore[arg-type]
    return ToolChoice("named", choice, False)  # a named choice is exactly one call


def parse_tool_list(raw: Any) -> list[Tool]:
    """``tools``: ``[{"type": "function", "function": {name, description, parameters}}]``, the
    shape OpenAI and Ollama share."""
    tools: list[Tool] = []
    for i, t in enumerate(check_tool_count(raw)):
        fn = t.get("function") if isinstance(t, dict) and t.get("type") == "function" else None
        if not isinstance(fn, dict):
            raise InvalidRequest(
                "each tool needs type function and a valid function name", param=f"tools[{i}]"
            )
        tools.append(
            make_tool(
                fn.get("name"),
                fn.get("description"),
                fn.get("parameters"),
                where=f"tools[{i}]",
                params=_OPENAI_PARAMS.format(i),
            )
        )
    return tools


def parse_tools(b: Body) -> tuple[list[Tool], ToolChoice]:
    """`tools`, `tool_choice` (none/auto/required/{"type":"function","function":{"name"}}) and
    `parallel_tool_calls` (default true)."""
    tools = parse_tool_list(b.data.get("tools"))
    tc = b.data.get("tool_choice")
    choice = "auto" if tools else "none"
    if isinstance(tc, str):
        if tc not in ("none", "auto", "required"):
            raise InvalidRequest(
                "'tool_choice' must be none, auto, required or a function", param="tool_choice"
            )
        choice = tc
    elif isinstance(tc, dict):
        fn = tc.get("function") if tc.get("type") == "function" else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise InvalidRequest("'tool_choice' must name a function", param="tool_choice")
        choice = fn["name"]
    elif tc is not None:
        raise InvalidRequest("'tool_choice' must be a string or an object", param="tool_choice")
    return tools, tool_choice(
        choice,
        tools,
        [_OPENAI_PARAMS.format(i) for i in range(len(tools))],
        parallel=b.flag("parallel_tool_calls", True),
        param="tool_choice",
    )


def parse_top_logprobs(b: Body) -> int | None:
    """``top_logprobs``: how many alternatives each token's logprob comes with (0-20), or None
    when absent. Whether logprobs are on at all is each protocol's own field."""
    return b.integer("top_logprobs", None, lo=0, hi=MAX_TOP_LOGPROBS)


def parse_logprobs_flag(b: Body, *, zero_alone: bool = False) -> int | None:
    """``logprobs`` (a boolean) with ``top_logprobs`` (0-20), as chat completions and Ollama
    take them: None when off, else how many alternatives each token comes with.
    ``top_logprobs`` without ``logprobs: true`` is a 400, except 0 where ``zero_alone`` (Ollama's
    default, which its clients send with logprobs off)."""
    on = b.flag("logprobs")
    top = parse_top_logprobs(b)
    if top is not None and not on and (top or not zero_alone):
        raise InvalidRequest("'top_logprobs' needs 'logprobs': true", param="top_logprobs")
    return (top or 0) if on else None


def tool_parse_field(final: Delta | None) -> dict[str, str]:
    """Hearth's extension on an answer whose started tool call came back as text: the reason
    (``incomplete``, ``malformed_arguments``, ``unknown_tool``), under ``hearth_tool_parse``."""
    if final is None or final.tool_parse is None:
        return {}
    return {"hearth_tool_parse": final.tool_parse.reason}


def token_logprobs(lps: Sequence[TokenLogprob]) -> list[dict[str, Any]]:
    """Each token's ``token``/``logprob``/``bytes`` and its ``top_logprobs`` alternatives (the
    same three fields): OpenAI chat's ``logprobs.content``, the Responses ``output_text``
    ``logprobs`` and Ollama's ``logprobs`` all take this list."""
    return [
        {
            "token": t.token,
            "logprob": t.logprob,
            "bytes": list(t.bytes),
            "top_logprobs": [{"token": s, "logprob": lp, "bytes": list(bs)} for s, lp, bs in t.top],
        }
        for t in lps
    ]


REASONING_EFFORTS = ("minimal", "low", "medium", "high")
MAX_TEMPLATE_VARS_BYTES = 16 * 1024


def parse_template_vars(b: Body) -> dict[str, Any] | None:
    """Chat-template variables from a request: ``chat_template_kwargs`` (the object vLLM and
    llama.cpp's server accept, e.g. ``{"enable_thinking": false}``) and ``reasoning_effort``
    (given to the template as ``reasoning_effort``, which gpt-oss templates read)."""
    out: dict[str, Any] = {}
    raw = b.data.get("chat_template_kwargs")
    if raw is not None:
        if not isinstance(raw, dict) or not all(isinstance(k, str) and k for k in raw):
            raise InvalidRequest(
                "'chat_template_kwargs' must be an object of variables",
                param="chat_template_kwargs",
            )
        if (
            json_depth(raw, MAX_SCHEMA_DEPTH) > MAX_SCHEMA_DEPTH
            or len(json.dumps(raw)) > MAX_TEMPLATE_VARS_BYTES
        ):
            raise InvalidRequest(
                "'chat_template_kwargs' is too large or too deep", param="chat_template_kwargs"
            )
        out.update(raw)
    effort = b.data.get("reasoning_effort")
    if effort is not None:
        if effort not in REASONING_EFFORTS:
            raise InvalidRequest(
                f"'reasoning_effort' must be one of {', '.join(REASONING_EFFORTS)}",
                param="reasoning_effort",
            )
        out["reasoning_effort"] = effort
    return out or None
