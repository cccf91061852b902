"""OpenAI chat completions, legacy completions and embeddings, parsed: body -> request.

Pure translation (no aiohttp): the routes in ``app/server/routes/openai.py`` hand the bodies
here; the fields themselves are read in fields.py, the answers written by render.py.
Tested by tests/server/protocols/openai/test_adapter.py and
tests/server/protocols/test_image_parts.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.core.requests import ChatRequest, CompletionRequest, EmbeddingRequest, Infill
from app.errors import InvalidRequest
from app.server.protocols.common import (
    MAX_N,
    Body,
    parse_max_tokens,
    parse_priority,
    parse_sampling,
    parse_stop,
    parse_template_vars,
    parse_tools,
    parse_ttl,
)
from app.server.protocols.fields_registry import (
    OPENAI_CHAT,
    OPENAI_COMPLETIONS,
    OPENAI_EMBEDDINGS,
    refuse_unhonoured,
)
from app.server.protocols.openai.fields import (
    StreamOptions,
    parse_completion_max_tokens,
    parse_embedding_input,
    parse_logprobs,
    parse_messages,
    parse_prompt,
    parse_prompt_logprobs,
    parse_response_format,
    parse_stream,
)


def model_field(b: Body) -> str:
    """The request's model; "" when absent or empty (the gateway then takes default_model, or
    answers 400 when none is set)."""
    return b.text("model") or ""


@dataclass(frozen=True, slots=True)
class Parsed:
    """A request and how the client wants it answered."""

    request: Any  # ChatRequest | CompletionRequest
    stream: StreamOptions


def parse_chat(data: dict[str, Any]) -> Parsed:
    b = Body(data)
    refuse_unhonoured(data, OPENAI_CHAT)
    model = model_field(b)
    messages = parse_messages(b)
    sampling = parse_sampling(b)
    stop = parse_stop(b)
    max_tokens = parse_max_tokens(b)
    so = parse_stream(b)
    tools, choice = parse_tools(b)
    req = ChatRequest(
        model=model,
        messages=tuple(messages),
        sampling=sampling,
        max_tokens=max_tokens,
        stop=stop,
        tools=tuple(tools),
        tool_choice=choice,
        constraint=parse_response_format(b),
        logprobs=parse_logprobs(b, chat=True),
        template_vars=parse_template_vars(b) or {},
        ttl=parse_ttl(b),
        n=b.integer("n", 1, lo=1, hi=MAX_N) or 1,
        prompt_logprobs=parse_prompt_logprobs(b, so.stream),
        add_generation_prompt=b.flag("add_generation_prompt", True),
        continue_final_message=parse_continue_final(b),
        priority=parse_priority(b),
    )
    return Parsed(req, so)


def parse_continue_final(b: Body) -> bool:
    """vLLM's ``continue_final_message``: the last message left open for the model to go on
    with (it cannot come with an explicit ``add_generation_prompt: true``)."""
    cont = b.flag("continue_final_message")
    if cont and b.flag("add_generation_prompt"):
        raise InvalidRequest(
            "'continue_final_message' and 'add_generation_prompt' cannot both be true",
            param="continue_final_message",
        )
    return cont


def parse_completion(data: dict[str, Any]) -> Parsed:
    b = Body(data)
    refuse_unhonoured(data, OPENAI_COMPLETIONS)
    model = model_field(b)
    prompts = parse_prompt(b)
    sampling = parse_sampling(b)
    stop = parse_stop(b)
    echo = b.flag("echo")
    max_tokens = parse_completion_max_tokens(b, echo)
    so = parse_stream(b)
    infill = parse_suffix(b, prompts, echo)
    req = CompletionRequest(
        model=model,
        prompts=tuple(p if isinstance(p, str) else tuple(p) for p in prompts),
        sampling=sampling,
        max_tokens=max_tokens,
        stop=stop,
        # an extension here, as vLLM and llama.cpp take it
        constraint=parse_response_format(b),
        logprobs=parse_logprobs(b, chat=False),
        ttl=parse_ttl(b),
        n=b.integer("n", 1, lo=1, hi=MAX_N) or 1,
        echo=echo,
        prompt_logprobs=parse_prompt_logprobs(b, so.stream),
        infill=infill,
        priority=parse_priority(b),
    )
    return Parsed(req, so)


def parse_suffix(b: Body, prompts: list[Any], echo: bool) -> Infill | None:
    """OpenAI's insert mode: ``suffix`` follows the completion, each text ``prompt`` precedes
    it (an empty suffix asks for a plain completion). Echo refused as OpenAI refuses it."""
    suffix = b.text("suffix")
    if not suffix:
        return None
    if echo:
        raise InvalidRequest("'echo' is not available with 'suffix' (insert mode)", param="echo")
    if not all(isinstance(p, str) for p in prompts):
        raise InvalidRequest(
            "with 'suffix' the prompt is the text before the insertion: token ids are not taken",
            param="prompt",
        )
    return Infill(suffix=suffix)


def parse_embeddings(data: dict[str, Any]) -> tuple[EmbeddingRequest, str]:
    """The request and its ``encoding_format`` (float | base64)."""
    b = Body(data)
    refuse_unhonoured(data, OPENAI_EMBEDDINGS)
    model = model_field(b)
    inputs = parse_embedding_input(b)
    fmt = b.text("encoding_format", default="float")
    if fmt not in ("float", "base64"):
        raise InvalidRequest(
            "'encoding_format' must be 'float' or 'base64'", param="encoding_format"
        )
    req = EmbeddingRequest(
        model=model,
        inputs=tuple(i if isinstance(i, str) else tuple(i) for i in inputs),
        ttl=parse_ttl(b),
        dimensions=b.integer("dimensions", None, lo=1, hi=1 << 16),
    )
    return req, fmt or "float"
