"""How many requests the default load decodes at once: up to ``parallel`` (8) while their cells
are few, 4 once every token attending the others' cells would cost more than the wider step
saves (app/runtimes/llama/admission.py). The first decode step waits at a gate until every
request is queued, so what joins does not depend on the machine's speed."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from app.core.service import Hearth
from app.core.types import ChatMessage, SamplingParams
from app.runtimes.llama.admission import (
    BASE_WIDTH,
    PROMPT_PIECE_CPU,
    goes_wide,
    small_joins,
    wide_cells,
)
from app.runtimes.worker import INTERACTIVE_MAX_TOKENS
from tests.runtimes.llama.test_mixed_batch import at_the_gate, gate_first_step, hearth
from tests.support.service_calls import chat

WORDS = "river stone light quiet market garden winter letter window harbor village bridge".split()


def test_more_at_once_only_while_the_cells_are_few() -> None:
    # SmolLM2's step costs ~6,500 cells of attention: 8 at once pay up to ~203 cells each
    assert goes_wide(200, 8, 6500) and not goes_wide(210, 8, 6500)
    assert goes_wide(270, 6, 6500)  # fewer at once pay for more cells
    assert goes_wide(10**6, 8, float("inf"))  # a cache per sequence or a GPU: no bound
    assert BASE_WIDTH == 4
    # a quick question beside four long requests joins them; a like one (a burst) does not
    assert small_joins(50, [330.0] * 4, 6500) and not small_joins(330, [330.0] * 4, 6500)
    assert not small_joins(120, [600.0] * 7, 6500)  # 7 x 8 x 120 cells: more than it saves


async def burst(
    h: Hearth, model_id: str, prompts: list[str], max_tokens: int = 24, last_max: int = 0
) -> tuple[int, list[str]]:
    """The prompts sent while the first one's first step waits: the widest step, the texts
    (the last one's answer ``last_max`` tokens when given)."""
    lm = await h.models.load(model_id)
    engine = lm.engine  # type: ignore[attr-defined]
    engine.peak_batch = 0
    opened = gate_first_step(engine)
    # the answers run to max_tokens (no end-of-turn), so how many decode at once depends on
    # the order of the steps alone
    eos = engine.tokenize("<|im_end|>", add_special=False, parse_special=True)
    greedy = SamplingParams(temperature=0, logit_bias=tuple((t, -100.0) for t in eos))

    async def one(prompt: str, n: int = max_tokens) -> Any:
        return await chat(h, model_id, [ChatMessage("user", prompt)], sampling=greedy,
                          max_tokens=n)  # fmt: skip

    first = await one(prompts[0])
    it = first.__aiter__()
    head = await asyncio.wait_for(it.__anext__(), 60)  # its prompt is read; its step waits
    await at_the_gate(opened)
    others = [await one(p) for p in prompts[1:-1]]  # queued when this returns
    others.append(await one(prompts[-1], last_max or max_tokens))
    opened.set()
    texts = [head.text + "".join([d.text async for d in it])]
    for g in others:
        texts.append("".join([d.text async for d in g]))
    return engine.peak_batch, texts


# an answer that still runs while three ~320-token prompts are read beside it, a piece a step
LONG_ENOUGH = 3 * 320 // PROMPT_PIECE_CPU + 16


# a liveness bound: on a loaded machine the three bursts take minutes (OpenMP threads wait
# for each other), while what decodes at once is held by the gate, not by the machine's speed
@pytest.mark.model
@pytest.mark.timeout(1200)
async def test_the_default_load_decodes_eight_short_requests_at_once_and_long_ones_four(
    tmp_path: Path, smollm2_path: Path
) -> None:
    h = hearth(tmp_path)  # the default load, with a 2,048-token cache
    model, _ = h.models.import_path(smollm2_path)
    try:
        lm = await h.models.load(model.id)
        engine = lm.engine  # type: ignore[attr-defined]
        assert engine.max_sequences == 8, "the default parallel"
        assert 5000 < engine.step_cells < 8000, engine.step_cells  # SmolLM2's, on the CPU
        assert wide_cells(engine.model) == engine.step_cells
        topics = ("cat", "lighthouse", "dragon", "robot", "garden", "river", "train", "owl")
        short = [f"Write a short story about a {t}." for t in topics]  # ~40 tokens each
        widest, texts = await burst(h, model.id, short)
        assert widest == 8, "eight short requests decode in one step"
        assert all(texts), texts
        # ~320 prompt tokens each: every token attending 8 such would cost more than the
        # wider step saves, so 4 decode at once and the others wait for them
        long = [
            " ".join(WORDS[(i * 7 + k) % len(WORDS)] for k in range(300)) + f"\nA story about {t}."
            for i, t in enumerate(topics)
        ]
        # answers long enough to still run while the others' prompts are read, a piece a step
        widest, texts = await burst(h, model.id, long, max_tokens=LONG_ENOUGH)
        assert widest == 4, "long requests decode four at once"
        assert all(texts), texts
        # a short one beside four long ones joins them at once, not after one of them ends
        widest, texts = await burst(h, model.id, long[:4] + short[:1], max_tokens=LONG_ENOUGH)
        assert widest == 5, "the short request decoded beside the four long ones"
        assert all(texts), texts
    finally:
        await h.close()


@pytest.mark.model
@pytest.mark.timeout(1200)
async def test_an_interactive_request_joins_four_long_answers_at_once(
    tmp_path: Path, smollm2_path: Path
) -> None:
    """An editor's completion (a short answer, so interactive) beside four requests with long
    answers joins them at once, though its prompt is as long as theirs: it would otherwise wait
    for one of them to end. (Like requests still decode four at once, above.)"""
    h = hearth(tmp_path)
    model, _ = h.models.import_path(smollm2_path)
    try:
        long = [
            " ".join(WORDS[(i * 7 + k) % len(WORDS)] for k in range(240)) + f"\nA story {i}."
            for i in range(5)  # five prompts and their answers fit the 2,048-cell cache
        ]
        # the longest answer that is still interactive, so it runs on while theirs are read
        widest, texts = await burst(
            h, model.id, long, max_tokens=2 * LONG_ENOUGH, last_max=INTERACTIVE_MAX_TOKENS
        )
        assert widest == 5, "the interactive request decoded beside the four long answers"
        assert all(texts), texts
    finally:
        await h.close()


@pytest.mark.model
@pytest.mark.timeout(1200)
async def test_a_cache_stream_per_sequence_decodes_all_at_once(
    tmp_path: Path, smollm2_path: Path
) -> None:
    """With a cache stream per request a step's attention reads only each request's own
    cells, so long prompts do not bound how many decode at once."""
    h = hearth(tmp_path, kv_layout="per-sequence")
    model, _ = h.models.import_path(smollm2_path)
    try:
        long = [
            " ".join(WORDS[(i * 5 + k) % len(WORDS)] for k in range(300)) + "\nA story."
            for i in range(8)
        ]
        # their prompts are read a piece a step, one after another: answers long enough to
        # still run when the last prompt is read
        widest, texts = await burst(h, model.id, long, max_tokens=7 * 300 // PROMPT_PIECE_CPU + 16)
        assert widest == 8, "eight long requests decode at once, each in its own stream"
        assert all(texts), texts
    finally:
        await h.close()
