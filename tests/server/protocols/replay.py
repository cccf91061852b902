"""Recorded model outputs through the real splitters and parsers, and a renderer driven the way
app/server/streaming.py respond() drives it: no model, no server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

from app.core.inference.generation import Completion, Generation
from app.core.inference.reasoning import ReasoningSplitter
from app.core.inference.tools import ToolCallParser
from app.core.types import Delta, TokenLogprob, Usage
from app.errors import HearthError
from app.server.protocols.base import Frame, StreamRenderer


class Pieces:
    """A model's output in set pieces (one token each), then a final delta."""

    def __init__(self, pieces: Sequence[str], finish: str = "stop", **final: Any) -> None:
        self.pieces = list(pieces)
        self.finish = finish
        self.final = final

    async def __aiter__(self) -> AsyncIterator[Delta]:
        for p in self.pieces:
            yield Delta(text=p, token_count=1)
        yield Delta(
            finish_reason=self.finish,  # type: ignore[arg-type]
            usage=Usage(prompt_tokens=7, completion_tokens=len(self.pieces)),
            **self.final,
        )

    def cancel(self) -> None:
        pass


def deltas(
    pieces: Sequence[str], *, think: bool = False, tools: bool = False, **final: Any
) -> list[Delta]:
    """The deltas a chat generation makes of ``pieces`` (``think``: the prompt opened a think
    block; ``tools``: Hermes tool calls are parsed)."""
    gen = Generation(
        "m",
        7,
        Pieces(pieces, **final),  # type: ignore[arg-type]
        reasoning=ReasoningSplitter(inside=think),
        tools=ToolCallParser("hermes") if tools else None,
    )

    async def run() -> list[Delta]:
        return [d async for d in gen]

    return asyncio.run(run())


def completion(ds: Sequence[Delta]) -> Completion:
    out = Completion()
    for d in ds:
        out.add(d)
    return out


def has_payload(d: Delta) -> bool:
    return bool(d.text or d.reasoning or d.tool_calls or d.logprobs)


def render(r: StreamRenderer, ds: Sequence[Delta], error: HearthError | None = None) -> list[Frame]:
    """The frames of one choice, as respond() writes them; ``error``: the stream breaks after
    the last delta (a time limit, an unload) and never reaches its final."""
    out = r.open()
    for d in ds:
        if has_payload(d):
            out += r.delta(0, d)
        if d.finish_reason is not None and error is None:
            out += r.end_choice(0, d)
            out += r.close([d])
    if error is not None:
        out += r.error(error)
    return out


def events(frames: Sequence[Frame]) -> list[tuple[str | None, Any]]:
    return [(f.event, f.data) for f in frames]


def lp(token: str, logprob: float, *top: tuple[str, float]) -> TokenLogprob:
    """A token's logprob with its alternatives (bytes: the text's UTF-8)."""
    return TokenLogprob(
        token, logprob, tuple(token.encode()), tuple((t, x, tuple(t.encode())) for t, x in top)
    )


def lp_json(token: str, logprob: float, *top: tuple[str, float]) -> dict[str, Any]:
    """The same on the wire, as OpenAI's chat and output_text logprobs and Ollama's Logprob
    write it: token, logprob, bytes, and top_logprobs of the same three."""
    return {
        "token": token,
        "logprob": logprob,
        "bytes": list(token.encode()),
        "top_logprobs": [{"token": t, "logprob": x, "bytes": list(t.encode())} for t, x in top],
    }
