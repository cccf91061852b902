"""The scored prompt's deltas: the lead delta ahead of a generation, the prompt-only final
delta (max_tokens 0) with the tokens the engine decoded, and echo's text."""

from __future__ import annotations

import asyncio

from app.core.inference.generation import Completion
from app.core.inference.scoring import LedStream, echo_text, lead_delta, prompt_only
from app.core.types import PromptToken, ScoredPrompt

SCORED = ScoredPrompt(
    (
        PromptToken(5, None, None, text="Hello"),
        PromptToken(7, -1.5, 2, ((9, -0.5), (7, -1.5)), " world", (" there", " world")),
    ),
    decoded=1,
)


def test_a_prompt_scored_only_ends_at_length_with_no_completion_tokens() -> None:
    async def run() -> Completion:
        out = Completion()
        async for d in LedStream(lead_delta(SCORED, "Hello world"), None, prompt_only(SCORED)):
            out.add(d)
        return out

    done = asyncio.run(run())
    assert done.text == "Hello world"
    assert done.prompt == SCORED.tokens
    assert done.final.finish_reason == "length"
    assert done.final.usage is not None
    assert (done.final.usage.prompt_tokens, done.final.usage.completion_tokens) == (2, 0)
    assert done.final.usage.cached_tokens == 1  # one token came from the cache
    assert done.final.timings is not None and done.final.timings.prompt_n == 1


def test_echo_text_is_the_prompt_as_sent_or_its_tokens_spelled() -> None:
    assert echo_text("Hello  world", SCORED) == "Hello  world"
    assert echo_text([5, 7], SCORED) == "Hello world"


def test_a_scored_answer_comes_back_whole_from_the_response_cache_store() -> None:
    from app.core.gateway.cache.store import CachedAnswer, decode, encode

    answer = CachedAnswer("m", ((lead_delta(SCORED, "Hello world"), prompt_only(SCORED)),))
    assert decode(encode(answer)) == answer
