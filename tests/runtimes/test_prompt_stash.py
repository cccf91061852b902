"""Idle conversations' caches in host memory (the shared "reuse" cache): every step's attention
walks all used cells of a shared cache, so an idle cache moves to host memory (llama.cpp's
sequence state) when another sequence needs the cache, and comes back when its conversation
continues; the copies stay within a byte bound that the memory estimate counts."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from app.core.fit import STASH_CAP, estimate_gguf
from app.core.gguf import read_header
from app.core.library import ModelLibrary
from app.core.service import Hearth
from app.core.types import ChatMessage, LoadOptions, SamplingParams
from app.runtimes.llama_backend import L
from app.runtimes.llama_cpp import LlamaCppRuntime
from tests.conftest import assert_greedy_close, transcript
from tests.runtimes.test_mixed_batch import gate_first_step
from tests.service_calls import chat

pytestmark = pytest.mark.model

GREEDY = SamplingParams(temperature=0)
A = "The keeper climbed the stairs of the lighthouse every night and lit the lamp. " * 12
B = "A dragon slept under the mountain, dreaming of gold and of the sea. " * 12


def hearth(tmp_path: Path, **options: Any) -> Hearth:
    lib = ModelLibrary(tmp_path / "library.json", tmp_path / "models")
    rt = LlamaCppRuntime(probe_file=tmp_path / "probe.json")
    opts = LoadOptions(**{"context_length": 2048, **options})
    return Hearth(lib, {"gguf": rt}, load_defaults=lambda: opts)


async def ask(h: Hearth, model_id: str, messages: list[ChatMessage], n: int = 12) -> tuple:
    gen = await chat(h, model_id, messages, sampling=GREEDY, max_tokens=n, logprobs=3)
    return await transcript(gen)


def cells_of(engine: Any, slot: int) -> int:
    """How many positions a sequence holds in the device cache (0 when it holds none)."""
    return int(L.llama_memory_seq_pos_max(engine.mem, slot)) + 1


async def test_an_idle_cache_moves_to_host_memory_and_its_follow_up_restores_it(
    tmp_path: Path, smollm2_path: Path
) -> None:
    follow_up = [ChatMessage("user", A)]
    solo_h = hearth(tmp_path / "solo", parallel=1, prompt_cache="off")
    model, _ = solo_h.import_model(smollm2_path)
    try:
        first = await ask(solo_h, model.id, follow_up)
        follow_up += [ChatMessage("assistant", first[0]), ChatMessage("user", "And then?")]
        solo = await ask(solo_h, model.id, follow_up)
    finally:
        await solo_h.close()
    h = hearth(tmp_path / "h")  # the default load: reuse, one shared cache
    model, _ = h.import_model(smollm2_path)
    try:
        lm = await h.load(model.id)
        engine = lm.engine  # type: ignore[attr-defined]
        slots = engine.slots
        a1 = await ask(h, model.id, [ChatMessage("user", A)])
        if not assert_greedy_close(first[1], a1[1], "turn 1"):
            assert a1[0] == first[0]
        (a_slot,) = [sl for sl in slots.free if slots.kv[sl]]
        held = len(slots.kv[a_slot])
        assert cells_of(engine, a_slot) == held > 150
        assert not slots.stashed  # alone, it stays in place
        await ask(h, model.id, [ChatMessage("user", B)])  # another conversation
        assert cells_of(engine, a_slot) == 0, "the idle cache left the device cache"
        assert [len(e.tokens) for e in slots.stashed] == [held]
        assert 0 < slots.stashed_bytes <= slots.stash_limit
        b_held = [len(slots.kv[sl]) for sl in slots.free if slots.kv[sl]]  # B, in place
        # its conversation goes on: the whole earlier turn comes back, only the new part is read
        a2 = await ask(h, model.id, [*follow_up[:1], ChatMessage("assistant", a1[0]), follow_up[2]])
        assert slots.restores == 1
        assert a2[2].usage.cached_tokens >= held - 2  # the turn's end tokens are re-read
        if not assert_greedy_close(solo[1], a2[1], "the restored conversation"):
            assert solo[0] == a2[0]
        # A's copy left host memory as A went on; B's cache went there in turn
        assert [len(e.tokens) for e in slots.stashed] == b_held
    finally:
        await h.close()


async def test_a_stream_that_ends_while_others_run_leaves_their_cache(
    tmp_path: Path, smollm2_path: Path
) -> None:
    """The others' steps would walk its cells: it goes to host memory when it ends."""
    h = hearth(tmp_path / "h")
    model, _ = h.import_model(smollm2_path)
    try:
        lm = await h.load(model.id)
        engine = lm.engine  # type: ignore[attr-defined]
        opened = gate_first_step(engine)
        long = await chat(h, model.id, [ChatMessage("user", A)], sampling=GREEDY, max_tokens=40)
        it = long.__aiter__()
        await asyncio.wait_for(it.__anext__(), 60)  # its prompt is read; its step waits
        short = await chat(h, model.id, [ChatMessage("user", B)], sampling=GREEDY, max_tokens=2)
        opened.set()
        await transcript(short)  # two tokens: the long stream has 38 more steps to go
        running = [sl for sl in range(len(engine.slots.kv)) if sl not in engine.slots.free]
        assert len(running) == 1 and engine.slots.stashed, "the short one's cache left"
        assert all(cells_of(engine, sl) == 0 for sl in engine.slots.free)
        assert [d async for d in it][-1].finish_reason == "length"
    finally:
        await h.close()


async def test_host_copies_stay_within_the_bound_the_estimate_counts(
    tmp_path: Path, smollm2_path: Path
) -> None:
    """A 512-token cache: its host copies take at most that cache's bytes (the least recently
    used copy goes first), and the memory estimate counts as much."""
    h = hearth(tmp_path / "h", context_length=512)
    model, _ = h.import_model(smollm2_path)
    try:
        lm = await h.load(model.id)
        engine = lm.engine  # type: ignore[attr-defined]
        slots = engine.slots
        topics = ["lighthouse", "dragon", "robot", "garden", "harbour", "comet"]
        for topic in topics:  # six conversations of ~200 tokens: the copies hold 2 at most
            await ask(h, model.id, [ChatMessage("user", f"Tell me about the {topic}. " * 30)], 4)
        assert 1 <= len(slots.stashed) < len(topics) - 1
        assert slots.stashed_bytes <= slots.stash_limit
        est = estimate_gguf(read_header(smollm2_path), context_length=512)
        assert est.prompt_ram == min(est.kv_cache, STASH_CAP)
        assert est.total == est.weights + est.kv_cache + est.compute + est.overhead + est.prompt_ram
        # the bound is the cache's cells at the copies' bytes a token: the estimate's KV bytes
        # plus llama.cpp's few bytes of metadata a cell
        assert est.prompt_ram <= slots.stash_limit <= est.prompt_ram * 1.05
        texts = [b"".join(engine.pieces(e.tokens)).decode(errors="replace") for e in slots.stashed]
        assert any(topics[-2] in t for t in texts), "the most recently used copy is kept"
        assert not any(topics[0] in t for t in texts), "the least recently used went first"
        maps = [e.data for e in slots.stashed]
        await h.unload(model.id)  # freeing the model gives the copies' memory back
        assert not slots.stashed and slots.stashed_bytes == 0
        assert all(m.closed for m in maps)
    finally:
        await h.close()


@pytest.mark.parametrize("mode,layout", [("exact", "shared"), ("reuse", "per-sequence")])
async def test_separate_caches_keep_idle_caches_in_place(
    tmp_path: Path, smollm2_path: Path, mode: str, layout: str
) -> None:
    """A cache stream per sequence: an idle one costs the others nothing, and nothing is copied
    (the estimate counts no host memory for it)."""
    h = hearth(tmp_path / "h", prompt_cache=mode, kv_layout=layout)
    model, _ = h.import_model(smollm2_path)
    try:
        lm = await h.load(model.id)
        engine = lm.engine  # type: ignore[attr-defined]
        await ask(h, model.id, [ChatMessage("user", A)], 2)
        await ask(h, model.id, [ChatMessage("user", B)], 2)
        assert not engine.slots.stashed and engine.slots.stash_cells == 0
        est = estimate_gguf(
            read_header(smollm2_path), context_length=2048, prompt_cache=mode, kv_layout=layout
        )
        assert est.prompt_ram == 0
    finally:
        await h.close()
