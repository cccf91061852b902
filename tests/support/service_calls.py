"""One generation through the façade's request types, for tests that drive the service directly."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from app.core.inference.generation import Generation
from app.core.requests import ChatRequest, CompletionRequest, EmbeddingRequest, ToolChoice
from app.core.service import Hearth
from app.core.types import ChatMessage


async def chat(h: Hearth, model: str, messages: Sequence[ChatMessage], **kw: Any) -> Generation:
    """The first (only) choice of a chat request; ``tool_choice`` may be a string."""
    tc = kw.pop("tool_choice", None)
    parallel = kw.pop("parallel_tool_calls", True)
    if isinstance(tc, str):
        mode = tc if tc in ("auto", "none", "required") else "named"
        kw["tool_choice"] = ToolChoice(mode, tc if mode == "named" else None, parallel)  # type: ignore[arg-type]
    elif tc is not None:
        kw["tool_choice"] = tc
    if "tools" in kw:
        kw["tools"] = tuple(kw["tools"])
    if "stop" in kw:
        kw["stop"] = tuple(kw["stop"])
    return (await h.chat(ChatRequest(model, tuple(messages), **kw))).first


async def complete(h: Hearth, model: str, prompt: str | Sequence[int], **kw: Any) -> Generation:
    p = prompt if isinstance(prompt, str) else tuple(prompt)
    if "stop" in kw:
        kw["stop"] = tuple(kw["stop"])
    return (await h.complete(CompletionRequest(model, (p,), **kw))).first


async def embed(
    h: Hearth, model: str, inputs: Sequence[str | Sequence[int]], **kw: Any
) -> tuple[list[list[float]], int]:
    items = tuple(i if isinstance(i, str) else tuple(i) for i in inputs)
    r = await h.embed(EmbeddingRequest(model, items, **kw))
    return r.vectors, r.prompt_tokens
