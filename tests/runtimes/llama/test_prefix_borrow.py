"""Prompts with a common start read it once (one shared "reuse" cache): a prompt arriving while
another with the same start runs shares the cells that one already holds, and of prompts that
come together one reads the common stretch while the others wait a step to share it. An
editor's keystrokes (each a longer copy of the last) and an agent's parallel calls arrive so.
The answers are those of a fresh run."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from app.core.types import ChatMessage
from tests.conftest import assert_greedy_close, transcript
from tests.runtimes.llama.test_mixed_batch import at_the_gate, gate_first_step
from tests.runtimes.llama.test_prompt_stash import GREEDY, ask, loaded
from tests.support.service_calls import chat

pytestmark = pytest.mark.model

STORY = "The keeper climbed the stairs of the lighthouse every night and lit the lamp. "


def count_placed(engine: Any) -> dict[int, int]:
    """Tokens placed in the cache per slot from now on (prompt pieces and decoded tokens)."""
    placed: dict[int, int] = defaultdict(int)
    real = engine.slots.append

    def append(slot: int, tokens: list[int]) -> None:
        placed[slot] += len(tokens)
        real(slot, tokens)

    engine.slots.append = append
    return placed


async def solo(tmp_path: Path, model_path: Path, prompts: list[str], n: int) -> list[tuple]:
    async with loaded(tmp_path, model_path, parallel=1, prompt_cache="off") as (h, mid, _):
        return [await ask(h, mid, [ChatMessage("user", p)], n) for p in prompts]


def busy(engine: Any) -> set[int]:
    return {sl for sl in range(len(engine.slots.kv)) if sl not in engine.slots.free}


async def test_a_prompt_arriving_while_another_runs_reads_only_what_differs(
    tmp_path: Path, smollm2_path: Path
) -> None:
    """B shares A's long start while A generates: B reads its own question only, and answers
    as a fresh run does."""
    common = STORY * 40  # ~640 tokens
    qa, qb = common + "Who lit the lamp?", common + "What did the keeper climb every night?"
    [fresh] = await solo(tmp_path / "solo", smollm2_path, [qb], 8)
    async with loaded(tmp_path / "h", smollm2_path, speculative="off") as (h, mid, engine):
        opened = gate_first_step(engine)
        a = await chat(h, mid, [ChatMessage("user", qa)], sampling=GREEDY, max_tokens=30)
        it = a.__aiter__()
        await asyncio.wait_for(it.__anext__(), 60)  # A's prompt is read; its step waits
        await at_the_gate(opened)
        (a_slot,) = busy(engine)
        placed = count_placed(engine)
        b = await chat(h, mid, [ChatMessage("user", qb)], sampling=GREEDY, max_tokens=8, logprobs=3)
        opened.set()
        text, lps, final = await transcript(b)
        [d async for d in it]
        usage = final.usage
        b_read = sum(v for sl, v in placed.items() if sl != a_slot)
        assert usage.cached_tokens > 600, usage  # A's cells
        # its question and its answer's tokens; without sharing, all ~660 prompt tokens
        assert b_read <= usage.prompt_tokens - usage.cached_tokens + 8, (b_read, usage)
        if not assert_greedy_close(fresh[1], lps, "B on A's cells"):
            assert text == fresh[0]


async def test_of_prompts_arriving_together_one_reads_their_common_start(
    tmp_path: Path, smollm2_path: Path
) -> None:
    """A and B (one piece each, a long common start) join in the same step: read together, the
    common start would be read twice in one decode; A reads it, B shares it a step later."""
    common = STORY * 10  # ~160 tokens: each prompt is one piece
    prompts = [common + "Who lit the lamp?", common + "What did the keeper climb every night?"]
    fresh = await solo(tmp_path / "solo", smollm2_path, prompts, 8)
    async with loaded(tmp_path / "h", smollm2_path, speculative="off") as (h, mid, engine):
        opened = gate_first_step(engine)
        # a running stream holds the worker at its first step while A and B queue behind it
        c = await chat(
            h, mid, [ChatMessage("user", "Count to ten.")], sampling=GREEDY, max_tokens=20
        )
        it = c.__aiter__()
        await asyncio.wait_for(it.__anext__(), 60)
        await at_the_gate(opened)
        (c_slot,) = busy(engine)
        placed = count_placed(engine)
        gens = [
            await chat(h, mid, [ChatMessage("user", p)], sampling=GREEDY, max_tokens=8, logprobs=3)
            for p in prompts
        ]
        opened.set()
        got = [await transcript(g) for g in gens]
        [d async for d in it]
        read = sum(v for sl, v in placed.items() if sl != c_slot)
        usage = [g[2].usage for g in got]
        shared = max(u.cached_tokens for u in usage)
        assert shared > 150, usage  # the second one's common start: the first one's cells
        # each prompt's own tokens once, and the answers; read side by side: ~2 x 170
        own = sum(u.prompt_tokens for u in usage) - shared
        assert read <= own + 16, (read, usage)
        for (text, lps, _), (f_text, f_lps, _) in zip(got, fresh, strict=True):
            if not assert_greedy_close(f_lps, lps, "shared start"):
                assert text == f_text
