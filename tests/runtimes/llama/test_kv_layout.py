"""kv_layout "per-sequence": a llama.cpp cache stream per parallel request, on the real SmolLM2.

Each request may use the whole context, the streams decode in one batch, answers agree with
solo runs as the reuse mode promises, and conversations keep their own caches (a long common
prefix is copied into another stream rather than computed again).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from app.core.library.index import ModelLibrary
from app.core.service import Hearth, assemble
from app.core.types import ChatMessage, LoadOptions, SamplingParams
from app.runtimes.llama.runtime import LlamaCppRuntime
from app.runtimes.worker import common_prefix
from tests.conftest import assert_greedy_close, transcript
from tests.support import probes
from tests.support.service_calls import chat, complete

pytestmark = pytest.mark.model

GREEDY = SamplingParams(temperature=0)


def hearth(tmp_path: Path, **options: object) -> Hearth:
    lib = ModelLibrary(tmp_path / "library.json", tmp_path / "models")
    rt = LlamaCppRuntime(probe_file=probes.shared())
    opts = LoadOptions(context_length=1024, **options)  # type: ignore[arg-type]
    return assemble(lib, {"gguf": rt}, load_defaults=lambda: opts)


def assert_close(a: tuple, b: tuple, what: str) -> None:
    if not assert_greedy_close(a[1], b[1], what):
        assert a[0] == b[0], f"{what}: the text changed"


async def ask(h: Hearth, model_id: str, messages: list[ChatMessage], n: int) -> tuple:
    text, lps, final = await transcript(
        await chat(h, model_id, messages, sampling=GREEDY, max_tokens=n, logprobs=3)
    )
    return text, lps, final


async def test_each_request_gets_its_own_cache_and_they_decode_together(
    tmp_path: Path, smollm2_path: Path
) -> None:
    prompts = [
        f"Write a short story about a {x}." for x in ("cat", "lighthouse", "dragon", "robot")
    ]
    solo_h = hearth(tmp_path / "solo", parallel=1, prompt_cache="off")
    model, _ = solo_h.models.import_path(smollm2_path)
    try:
        solo = [(await ask(solo_h, model.id, [ChatMessage("user", p)], 40))[:2] for p in prompts]
    finally:
        await solo_h.close()

    h = hearth(tmp_path / "per", parallel=4, kv_layout="per-sequence")
    model, _ = h.models.import_path(smollm2_path)
    try:
        lm = await h.models.load(model.id)
        engine = lm.engine  # type: ignore[attr-defined]
        assert not engine.unified
        assert (engine.max_sequences, lm.context_length, engine.cache_tokens) == (4, 1024, 4096)
        together = await asyncio.gather(
            *(ask(h, model.id, [ChatMessage("user", p)], 40) for p in prompts)
        )
        assert engine.peak_batch == 4, "the four requests were decoded in one batch"
        for i, (a, b) in enumerate(zip(solo, together, strict=True)):
            assert_close(a, b[:2], f"request {i}")
        # four prompts near the whole context run at once: no stream waits for another's cells
        long = "The sea. " * 300
        gens = await asyncio.gather(
            *(complete(h, model.id, long + str(i), sampling=GREEDY, max_tokens=8) for i in range(4))
        )
        finals = [(await g.collect()).final for g in gens]
        assert all(f.finish_reason == "length" and f.usage.prompt_tokens > 900 for f in finals)
        assert engine.preempted == 0
    finally:
        await h.close()


async def test_conversations_keep_their_own_streams_and_a_long_prefix_is_copied(
    tmp_path: Path, smollm2_path: Path
) -> None:
    """Three conversations with one long system prompt, taking turns: the second and third
    first turns start from the first one's stream, copied (its prefix was not computed again)
    and right (the answers are those of an uncached run); every follow-up reuses its own
    conversation's whole cache."""
    system = ChatMessage("system", "You are a careful meeting secretary. " * 20)
    convs = [
        [system, ChatMessage("user", f"Meeting {c}: item {c} was discussed. Summarise.")]
        for c in range(3)
    ]
    plain_h = hearth(tmp_path / "plain", parallel=1, prompt_cache="off")
    model, _ = plain_h.models.import_path(smollm2_path)
    try:
        plain = [(await ask(plain_h, model.id, list(c), 12))[:2] for c in convs]
    finally:
        await plain_h.close()

    h = hearth(tmp_path / "per", parallel=3, kv_layout="per-sequence")
    model, _ = h.models.import_path(smollm2_path)
    try:
        firsts = []
        for c, conv in enumerate(convs):
            text, lps, final = await ask(h, model.id, conv, 12)
            if c == 0:
                assert final.usage.cached_tokens == 0
            else:  # the system prompt's turn came from the first conversation's stream
                assert final.usage.cached_tokens > 100
            assert_close(plain[c], (text, lps), f"conversation {c}'s first turn")
            firsts.append(final.usage.prompt_tokens)
            conv += [ChatMessage("assistant", text), ChatMessage("user", "And then?")]
        for conv, first in zip(convs, firsts, strict=True):
            _, _, final = await ask(h, model.id, conv, 4)
            assert final.usage.cached_tokens > first, "the conversation's own cache was reused"
    finally:
        await h.close()


async def test_a_common_prefix_is_copied_when_cheaper_than_computing_it(
    tmp_path: Path, smollm2_path: Path
) -> None:
    """llama.cpp copies a whole stream, which costs what a few prompt tokens do
    (``stream_copy_min``: 3 for SmolLM2's 1,024-cell streams). A new prompt sharing at least
    that many tokens with another stream starts from a copy of it; one sharing fewer takes an
    empty stream and computes its prompt."""
    h = hearth(tmp_path, parallel=3, kv_layout="per-sequence")
    model, _ = h.models.import_path(smollm2_path)
    try:
        engine = (await h.models.load(model.id)).engine  # type: ignore[attr-defined]
        n = engine.slots.copy_min
        assert 1 < n < 16
        a = "The old grey cat slept on the warm mat by the kitchen door all afternoon."
        far = "The young dog ran along the beach."  # shares fewer than n tokens with a
        near = "The old grey cat woke up and walked to the garden."  # shares n or more

        def shared(x: str) -> int:
            tok = engine.tokenize
            return common_prefix(
                tok(a, add_special=True, parse_special=False),
                tok(x, add_special=True, parse_special=False),
            )

        assert 0 < shared(far) < n <= shared(near)
        first = await complete(h, model.id, a, sampling=GREEDY, max_tokens=4)
        await first.collect()
        got = []
        for prompt in (far, near):
            gen = await complete(h, model.id, prompt, sampling=GREEDY, max_tokens=4)
            got.append((await gen.collect()).final.usage.cached_tokens)
        assert got == [0, shared(near)], got
    finally:
        await h.close()


async def test_a_regenerated_answer_goes_on_in_its_own_stream(
    tmp_path: Path, smollm2_path: Path
) -> None:
    """Two conversations whose first turns share the chat template's prefix: the second
    starts from a copy of it in an empty stream, so the first keeps its cache; asking the first
    prompt again (a regenerated answer) goes on in its own stream, wholly cached, and takes
    nothing from the other conversation."""
    h = hearth(tmp_path, parallel=2, kv_layout="per-sequence")
    model, _ = h.models.import_path(smollm2_path)
    try:
        a = [ChatMessage("user", "Write a long story about cats.")]
        b = [ChatMessage("user", "Write a long story about dogs.")]
        text, _, fa1 = await ask(h, model.id, a, 64)
        # the stream then holds more answer than prompt (what the rule below looks at)
        assert fa1.usage.completion_tokens > fa1.usage.prompt_tokens
        text_b, _, fb = await ask(h, model.id, b, 8)
        assert 0 < fb.usage.cached_tokens < fb.usage.prompt_tokens - 1, "the template's prefix"
        # both streams are taken: asking the first prompt again (a regenerated answer) goes on
        # in its own stream, wholly cached, and takes nothing from the other conversation
        _, _, again = await ask(h, model.id, a, 8)
        assert again.usage.cached_tokens == again.usage.prompt_tokens - 1
        b += [ChatMessage("assistant", text_b), ChatMessage("user", "More.")]
        _, _, fb2 = await ask(h, model.id, b, 4)
        assert fb2.usage.cached_tokens > fb.usage.prompt_tokens, "the other kept its stream"
        a += [ChatMessage("assistant", text), ChatMessage("user", "More.")]
        _, _, fa = await ask(h, model.id, a, 4)
        assert fa.usage.cached_tokens > 0, "the first conversation kept its stream"
    finally:
        await h.close()
