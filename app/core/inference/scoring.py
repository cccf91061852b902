"""Prompt scoring for echo and prompt_logprobs: the prompts scored by the model's runtime (one
job for a request's whole list), their tokens spelled, and the delta that carries them ahead
of a generation (or in place of one: ``max_tokens`` 0 scores the prompt only).
Tested by tests/core/inference/test_scoring.py and tests/server/clients/test_scoring.py."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Sequence

from app.core.types import (
    Delta,
    GenerationStream,
    LoadedModel,
    PromptScorer,
    ScoredPrompt,
    Timings,
    Usage,
)
from app.errors import UnsupportedParameter


async def score(
    lm: LoadedModel, model: str, prompts: Sequence[Sequence[int]], top: int, param: str
) -> list[ScoredPrompt]:
    """Each prompt's tokens with their log-probabilities and ``top`` alternatives, spelled.

    Raises:
        UnsupportedParameter: the model's runtime gives no prompt log-probabilities (MLX, an
            embedding model), or a prompt holds images.
    """
    if not isinstance(lm, PromptScorer) or "completion" not in lm.capabilities:
        raise UnsupportedParameter(
            f"'{model}' cannot score prompts: its runtime gives no log-probabilities for "
            "prompt tokens (a GGUF model on llama.cpp does)",
            param=param,
        )
    if any(t < 0 for p in prompts for t in p):
        raise UnsupportedParameter(
            "prompt log-probabilities are not available for a prompt with images", param=param
        )
    scored = await lm.score_prompts([list(p) for p in prompts], top)
    ids = sorted({i for s in scored for t in s.tokens for i in (t.id, *(a for a, _ in t.top))})
    # thousands of pieces for a long list's alternatives: spelled off the event loop
    text = dict(zip(ids, await asyncio.to_thread(lm.token_pieces, ids), strict=True))
    return [
        dataclasses.replace(
            s,
            tokens=tuple(
                dataclasses.replace(t, text=text[t.id], top_text=tuple(text[a] for a, _ in t.top))
                for t in s.tokens
            ),
        )
        for s in scored
    ]


def echo_text(prompt: str | Sequence[int], scored: ScoredPrompt) -> str:
    """What echo puts before the answer: the prompt's text as sent, or its tokens spelled."""
    return prompt if isinstance(prompt, str) else "".join(t.text for t in scored.tokens)


def lead_delta(scored: ScoredPrompt, text: str = "") -> Delta:
    """The first delta of a scored choice: the echoed text and the prompt's tokens."""
    return Delta(text=text, prompt=scored.tokens)


def prompt_only(scored: ScoredPrompt) -> Delta:
    """The final delta of a choice that scores its prompt and generates nothing."""
    n = len(scored.tokens)
    return Delta(
        finish_reason="length",
        usage=Usage(prompt_tokens=n, completion_tokens=0, cached_tokens=n - scored.decoded),
        timings=Timings(prompt_n=scored.decoded, cache_n=n - scored.decoded),
    )


class LedStream:
    """A generation's stream with a delta ahead of it; without a generation, ``final`` after
    that delta (the prompt scored only)."""

    def __init__(
        self, lead: Delta, inner: GenerationStream | None, final: Delta | None = None
    ) -> None:
        self._lead = lead
        self._inner = inner
        self._final = final

    def __aiter__(self) -> AsyncIterator[Delta]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Delta]:
        yield self._lead
        if self._inner is not None:
            async for d in self._inner:
                yield d
        elif self._final is not None:
            yield self._final

    def cancel(self) -> None:
        if self._inner is not None:
            self._inner.cancel()
