"""Idle conversations' caches in host memory (the shared "reuse" cache): every step's attention
walks all used cells of a shared cache, so an idle cache moves to host memory (llama.cpp's
sequence state) when another sequence needs the cache, and comes back when its conversation
continues; the copies stay within a byte bound that the memory estimate counts."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import app.runtimes.llama.engine as engine_module
from app.core.library.fit import STASH_CAP, estimate_gguf
from app.core.library.gguf import read_header
from app.core.library.index import ModelLibrary
from app.core.service import Hearth, assemble
from app.core.types import ChatMessage, LoadOptions, SamplingParams
from app.runtimes.llama.backend import L
from app.runtimes.llama.runtime import LlamaCppRuntime
from app.runtimes.worker import common_prefix
from tests.conftest import assert_greedy_close, transcript
from tests.runtimes.llama.test_mixed_batch import at_the_gate, gate_first_step
from tests.support import probes
from tests.support.service_calls import chat, complete

pytestmark = pytest.mark.model

GREEDY = SamplingParams(temperature=0)
A = "The keeper climbed the stairs of the lighthouse every night and lit the lamp. " * 12
B = "A dragon slept under the mountain, dreaming of gold and of the sea. " * 12


@pytest.fixture(autouse=True)
def cold(monkeypatch: pytest.MonkeyPatch) -> None:
    """No warm window (engine.WARM_S): these tests' short answers are interactive requests,
    whose caches would otherwise stay in place for the rules under test to pass over (the
    window has a test of its own, which sets it)."""
    monkeypatch.setattr(engine_module, "WARM_S", 0.0)


def hearth(tmp_path: Path, **options: Any) -> Hearth:
    lib = ModelLibrary(tmp_path / "library.json", tmp_path / "models")
    rt = LlamaCppRuntime(probe_file=probes.shared())
    opts = LoadOptions(**{"context_length": 2048, **options})
    return assemble(lib, {"gguf": rt}, load_defaults=lambda: opts)


@contextlib.asynccontextmanager
async def loaded(tmp_path: Path, model_path: Path, **options: Any) -> AsyncIterator[tuple]:
    """(service, model id, engine) of a model loaded with ``options``; closed afterwards."""
    h = hearth(tmp_path, **options)
    model, _ = h.models.import_path(model_path)
    try:
        lm = await h.models.load(model.id)
        yield h, model.id, lm.engine  # type: ignore[attr-defined]
    finally:
        await h.close()


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
    model, _ = solo_h.models.import_path(smollm2_path)
    try:
        first = await ask(solo_h, model.id, follow_up)
        follow_up += [ChatMessage("assistant", first[0]), ChatMessage("user", "And then?")]
        solo = await ask(solo_h, model.id, follow_up)
    finally:
        await solo_h.close()
    h = hearth(tmp_path / "h")  # the default load: reuse, one shared cache
    model, _ = h.models.import_path(smollm2_path)
    try:
        lm = await h.models.load(model.id)
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


async def test_a_stream_that_ends_while_others_run_leaves_once_its_cells_cost_its_copy(
    tmp_path: Path, smollm2_path: Path
) -> None:
    """The others' steps walk its cells, but copying them costs too (a range at a time): it
    stays in place until the attention it has cost the others adds up to its copy's cost, then
    goes to host memory, long before the others end."""
    # one token a step (no drafts), so the long stream's steps each charge its own cells once
    async with loaded(tmp_path / "h", smollm2_path, speculative="off") as (h, mid, engine):
        slots = engine.slots
        seen: dict[str, Any] = {}
        real_end, real_stash = engine.end, slots.stash

        def end(seq: Any) -> None:
            short = seq.request.max_tokens == 2
            slot = seq.engine_state.slot
            real_end(seq)
            if short:  # the step counter starts; its cache is in place, idle
                seen.update(slot=slot, steps=0, cells=cells_of(engine, slot))
                seen["cost"] = slots.copy_cost(slot)
                (running,) = [sl for sl in range(len(slots.kv)) if sl not in slots.free]
                # what the long stream does not share with it (the system prompt)
                seen["own"] = len(slots.kv[slot]) - common_prefix(slots.kv[slot], slots.kv[running])

        def stash(slot: int) -> bool:
            if slot == seen.get("slot"):
                seen["stashed_after"] = seen["steps"]
            return real_stash(slot)

        engine.end, slots.stash = end, stash
        opened = gate_first_step(engine)
        step = engine._decode_step

        def counted(*args: Any) -> int:
            if "steps" in seen:
                seen["steps"] += 1
            return step(*args)

        engine._decode_step = counted
        long = await chat(h, mid, [ChatMessage("user", A)], sampling=GREEDY, max_tokens=60)
        it = long.__aiter__()
        await asyncio.wait_for(it.__anext__(), 60)  # its prompt is read; its step waits
        await at_the_gate(opened)
        short = await chat(h, mid, [ChatMessage("user", B)], sampling=GREEDY, max_tokens=2)
        opened.set()
        await transcript(short)
        assert [d async for d in it][-1].finish_reason == "length"
        assert seen["cells"] > 150, "it stayed in place when it ended"
        # each of the long stream's steps (one token) attends every cell of its own
        due = -(-seen["cost"] // seen["own"])
        assert 2 <= seen["stashed_after"] == due < 50, seen
        assert cells_of(engine, seen["slot"]) == 0 and slots.stashed


async def test_caches_that_come_due_together_leave_one_step_apart(
    tmp_path: Path, smollm2_path: Path
) -> None:
    """Two streams answered in one batch end together while a third runs: their rents reach
    their copies' costs in the same step, and they leave one step apart, so the running
    stream stalls for one copy at a time."""
    opts = {"parallel": 3, "speculative": "off"}  # one token a step, as the charges assume
    async with loaded(tmp_path / "h", smollm2_path, **opts) as (h, mid, engine):
        slots = engine.slots
        steps, copies = [0], []
        real_stash = slots.stash
        slots.stash = lambda slot: copies.append((steps[0], slot)) or real_stash(slot)
        opened = gate_first_step(engine)
        step = engine._decode_step
        due: dict[int, float] = {}
        real_end = engine.end

        long_slot: list[int] = []

        def end(seq: Any) -> None:
            slot = seq.engine_state.slot
            real_end(seq)
            if seq.request.max_tokens == 2:  # the long stream's steps charge it for its own
                own = len(slots.kv[slot]) - common_prefix(slots.kv[slot], slots.kv[long_slot[0]])
                due[slot] = slots.copy_cost(slot) / own

        def counted(*args: Any) -> int:
            steps[0] += 1
            return step(*args)

        engine._decode_step, engine.end = counted, end
        long = await chat(h, mid, [ChatMessage("user", A)], sampling=GREEDY, max_tokens=80)
        it = long.__aiter__()
        await asyncio.wait_for(it.__anext__(), 60)  # its prompt is read
        # its step waits: the questions below are admitted together after it (submitted
        # before the worker got there, the first one was admitted alone, ~1 run in 4)
        assert opened.reached.wait(60)
        long_slot.append(next(sl for sl in range(len(slots.kv)) if sl not in slots.free))
        # two questions of one length, read in one decode (one piece together); not the same
        # question twice: the second would share the first's cells
        questions = [
            "A dragon slept under the mountain, dreaming of gold and of the sea.",
            "A dragon slept under the mountain, dreaming of jade and of the sky.",
        ]
        shorts = [
            await chat(h, mid, [ChatMessage("user", q)], sampling=GREEDY, max_tokens=2)
            for q in questions
        ]
        opened.set()
        for s in shorts:
            await transcript(s)
        assert [d async for d in it][-1].finish_reason == "length"
        assert len(due) == 2 and len({round(d, 6) for d in due.values()}) == 1, due
        ours = [c for c in copies if c[1] in due]
        assert len(ours) == 2, copies
        assert ours[1][0] == ours[0][0] + 1, f"they left in steps {ours}"


async def test_a_cheap_idle_cache_leaves_before_the_next_prompt_is_read(
    tmp_path: Path, smollm2_path: Path
) -> None:
    """An idle cache in few ranges (a prompt read alone) is copied out as another request
    starts, before that request's prompt is read: the new cells then go where its were, low in
    the cache (placed after it, they would keep every step's attention span that long after it
    left). Rent alone would move it only after the first prompt chunk."""
    async with loaded(tmp_path / "h", smollm2_path) as (h, mid, engine):
        slots = engine.slots
        await ask(h, mid, [ChatMessage("user", A)], 4)
        (a_slot,) = holding(engine, A[:40])
        assert slots.ranges(a_slot) <= 2 and cells_of(engine, a_slot) > 150
        seen: list[int] = []
        prefill = engine._prefill

        def first_chunk(seq: Any, st: Any) -> None:
            seen.append(cells_of(engine, a_slot))  # A's cells as B's prompt starts
            prefill(seq, st)

        engine._prefill = first_chunk
        await ask(h, mid, [ChatMessage("user", B)], 4)
        assert seen and seen[0] == 0, "A was still in place when B's prompt was read"
        assert any(A[:40] in detok(engine, e.tokens) for e in slots.stashed), "A is kept"


async def two_keystrokes(
    h: Hearth, mid: str, engine: Any, between: list[ChatMessage] | None = None
) -> tuple[int, int]:
    """An editor's completion of some code, a chat of ``between`` (80 tokens), then the next
    keystroke's completion (the code a few characters longer, most of it cached): the first
    completion's slot and the cells it held."""
    code = "def area(width: float, height: float) -> float:\n    return width * height\n\n" * 14
    slots = engine.slots
    await transcript(await complete(h, mid, code, sampling=GREEDY, max_tokens=8))
    (first,) = [sl for sl in range(len(slots.kv)) if slots.kv[sl]]
    held = len(slots.kv[first])
    assert held > 280  # beyond llama.cpp's padding, where idle cells cost
    if between:
        await ask(h, mid, between, 80)
    nxt = await transcript(await complete(h, mid, code + "def pe", sampling=GREEDY, max_tokens=8))
    assert nxt[0] and nxt[2].usage.cached_tokens > 100
    return first, held


async def test_an_editors_last_completion_stays_in_place_beside_the_next_keystroke(
    tmp_path: Path, smollm2_path: Path
) -> None:
    """A completion whose prompt continues the last one's (an editor's next keystroke) shares
    that cache's prompt cells: the last one is not copied to host memory as it starts (the
    copy would take the shared cells too and free only its answer's), and it is still whole in
    place afterwards."""
    async with loaded(tmp_path / "h", smollm2_path) as (h, mid, engine):
        slots = engine.slots
        first, held = await two_keystrokes(h, mid, engine)
        assert not slots.stashed and slots.restores == 0
        assert len(slots.kv[first]) == held and cells_of(engine, first) == held


@pytest.mark.parametrize("warm", [600.0, 0.0])
async def test_an_editors_completion_stays_in_place_while_others_start_until_it_is_cold(
    tmp_path: Path, smollm2_path: Path, monkeypatch: pytest.MonkeyPatch, warm: float
) -> None:
    """An interactive request's cache stays in place while it is warm, whatever starts and
    runs meanwhile (an agent's or a chat's request, whose start and steps would move it to
    host memory): the editor's next keystroke continues it where it lies, with no copy back.
    Cold (warm 0 s), the same sequence copies it out and back."""
    monkeypatch.setattr(engine_module, "WARM_S", warm)  # the window, not the machine's speed
    async with loaded(tmp_path / "h", smollm2_path) as (h, mid, engine):
        slots = engine.slots
        # between the keystrokes, a chat with a long answer (not interactive)
        first, held = await two_keystrokes(h, mid, engine, [ChatMessage("user", B)])
        if warm:
            assert slots.restores == 0
            assert len(slots.kv[first]) == held and cells_of(engine, first) == held
            assert not any(e.tokens[:held] == slots.kv[first] for e in slots.stashed)
        else:
            assert slots.restores == 1  # copied out as the chat started, and back


async def test_an_editors_next_request_cools_the_last_ones_cache(
    tmp_path: Path, smollm2_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only an editor's last request's cache is kept warm: the next one, once it has taken what
    it shares, leaves the one before to the usual rules. An infill of another file (here: code
    that shares nothing) moves the last one's cache to host memory as it starts, rather than
    leave it in every step's attention for the window (the window is 600 s here)."""
    monkeypatch.setattr(engine_module, "WARM_S", 600.0)
    async with loaded(tmp_path / "h", smollm2_path) as (h, mid, engine):
        slots = engine.slots
        code = "def area(width: float, height: float) -> float:\n    return width * height\n\n"
        await transcript(await complete(h, mid, code * 14, sampling=GREEDY, max_tokens=8))
        (first,) = [sl for sl in range(len(slots.kv)) if slots.kv[sl]]
        held = list(slots.kv[first])
        assert len(held) > 280  # beyond llama.cpp's padding, where idle cells cost
        assert slots._warm(first, time.monotonic())
        other = "class Stack:\n    def __init__(self) -> None:\n        self.items = []\n\n" * 12
        out = await transcript(await complete(h, mid, other, sampling=GREEDY, max_tokens=8))
        assert out[0]
        assert any(e.tokens == held for e in slots.stashed), "the last one's cache left"
        assert cells_of(engine, first) == 0


async def two_together(h: Hearth, mid: str, engine: Any, n: int = 24) -> list[str]:
    """Answers to A and B decoded in one batch (a range per token each: scattered caches)."""
    opened = gate_first_step(engine)
    first = await chat(h, mid, [ChatMessage("user", A)], sampling=GREEDY, max_tokens=n)
    it = first.__aiter__()
    head = await asyncio.wait_for(it.__anext__(), 60)  # its prompt is read; its step waits
    await at_the_gate(opened)
    second = await chat(h, mid, [ChatMessage("user", B)], sampling=GREEDY, max_tokens=n)
    opened.set()
    rest = [d async for d in it]
    text_a = "".join(d.text for d in [head, *rest])
    text_b = (await transcript(second))[0]
    return [text_a, text_b]


@pytest.mark.parametrize("answer", [64, 1])
async def test_a_scattered_idle_cache_leaves_as_a_request_starts_when_it_would_soon_anyway(
    tmp_path: Path, smollm2_path: Path, answer: int
) -> None:
    """Two streams decoded in a batch (a range per token, dear copies) end, and a new request
    starts. If the rent a cache's cells would be charged while it runs (its tokens, each
    attending them) reaches the copy's cost, the cache leaves before the new prompt is read,
    so the new cells go low; a request that will decode one token does not move it."""
    async with loaded(tmp_path / "h", smollm2_path, parallel=2) as (h, mid, engine):
        slots = engine.slots
        seen: dict[str, Any] = {}
        real_begin = engine.begin

        def begin(seq: Any) -> None:
            if seq.request.max_tokens == answer:
                idle = [sl for sl in slots.free if slots.kv[sl]]
                seen["slot"] = slot = max(idle, key=lambda sl: len(slots.kv[sl]))
                seen.update(ranges=slots.ranges(slot), rent=slots.rent[slot])
                seen["cost"] = slots.copy_cost(slot)
                seen["own"] = len(slots.kv[slot]) - common_prefix(
                    slots.kv[slot], list(seq.request.prompt_tokens)
                )
            real_begin(seq)
            if seq.request.max_tokens == answer:
                upcoming = len(seq.request.prompt_tokens) - seq.cached
                seen["queries"] = slots.busy() * answer + upcoming
                seen["after"] = cells_of(engine, seen["slot"])

        engine.begin = begin
        await two_together(h, mid, engine)
        late = await chat(h, mid, [ChatMessage("user", "Hi")], sampling=GREEDY, max_tokens=answer)
        await transcript(late)
        assert seen["ranges"] > 16, "the answers lie scattered"
        projected = seen["rent"] + seen["queries"] * seen["own"]
        if answer > 1:
            assert projected >= seen["cost"], seen
            assert seen["after"] == 0, "it was still in place as the new request started"
        else:
            assert projected < seen["cost"], seen
            assert seen["after"] > 150, "it moved though its rent would stay below its copy's cost"


async def test_a_burst_continuing_a_batch_finds_its_caches_in_place(
    tmp_path: Path, smollm2_path: Path
) -> None:
    """Two conversations answered in one batch (their cells interleaved) continue at once.
    The first follow-up to start would charge the other's idle cache more than its copy costs,
    yet it stays: the running follow-up's own cells keep the attention span as high, and the
    other follow-up comes an instant later. Nothing is copied out and back (8 streams' first
    tokens waited ~200 ms for it), and both continue from their whole caches."""
    async with loaded(tmp_path / "h", smollm2_path, parallel=2) as (h, mid, engine):
        slots = engine.slots
        # 48-token answers: dear copies, which the first follow-up's prompt (its tokens each
        # attending the other's cells) does not pay for alone
        answers = await two_together(h, mid, engine, 48)
        stashes: list[int] = []
        real_stash = slots.stash
        slots.stash = lambda slot: stashes.append(slot) or real_stash(slot)
        seen: dict[str, Any] = {}
        real_begin = engine.begin
        both_sent = threading.Event()

        def begin(seq: Any) -> None:
            if not seen:
                # the other follow-up is queued before this one's steps begin (a burst)
                assert both_sent.wait(60), "the second follow-up was never sent"
                prompt = list(seq.request.prompt_tokens)
                held = [sl for sl in slots.free if len(slots.kv[sl]) > 150]
                other = min(held, key=lambda sl: common_prefix(slots.kv[sl], prompt))
                own = len(slots.kv[other]) - common_prefix(slots.kv[other], prompt)
                seen["cost"] = slots.copy_cost(other)
                real_begin(seq)
                upcoming = len(prompt) - seq.cached
                seen["projected"] = slots.rent[other] + (slots.busy() * 64 + upcoming) * own
            else:
                real_begin(seq)

        engine.begin = begin
        follow = [
            [ChatMessage("user", q), ChatMessage("assistant", a), ChatMessage("user", "And then?")]
            for q, a in zip((A, B), answers, strict=True)
        ]
        gens = [await chat(h, mid, m, sampling=GREEDY, max_tokens=64) for m in follow]
        both_sent.set()
        finals = [(await g.collect()).final for g in gens]
        assert seen["projected"] >= seen["cost"], "the rent rule alone would have moved it"
        assert stashes == [] and slots.restores == 0, "a cache was copied out and back"
        for m, final in zip(follow, finals, strict=True):
            cached = final.usage.cached_tokens
            assert cached > len(
                engine.tokenize(m[0].content, add_special=False, parse_special=False)
            ), final.usage


async def test_few_cells_are_never_copied(tmp_path: Path, smollm2_path: Path) -> None:
    """Below llama.cpp's padding of the attention span (256 cells) idle cells cost nothing: two
    short conversations both stay in place, and the second one's decode pays nothing for the
    first."""
    async with loaded(tmp_path / "h", smollm2_path) as (h, mid, engine):
        slots = engine.slots
        await ask(h, mid, [ChatMessage("user", "Hi there")], 8)
        await ask(h, mid, [ChatMessage("user", "Hello you")], 8)
        held = [len(k) for k in slots.kv if k]
        assert len(held) == 2 and sum(held) < 256
        assert not slots.stashed and not any(slots.rent)


def holding(engine: Any, text: str) -> list[int]:
    """The slots whose cache holds ``text``."""
    kv = engine.slots.kv
    return [sl for sl in range(len(kv)) if kv[sl] and text in detok(engine, kv[sl])]


def detok(engine: Any, tokens: list[int]) -> str:
    return b"".join(engine.pieces(tokens)).decode(errors="replace")


async def test_a_question_asked_again_drops_a_scattered_earlier_answer(
    tmp_path: Path, smollm2_path: Path
) -> None:
    """The same question again: an earlier answer decoded alone (its cells together, cheap to
    copy) is kept in host memory for a switch back to it; one decoded in a batch (a range per
    token) is dropped and the question continues in its slot, as llama-server's slots do."""
    async with loaded(tmp_path / "h", smollm2_path) as (h, mid, engine):
        slots = engine.slots
        q = [ChatMessage("user", A)]
        first = await ask(h, mid, q, 24)  # alone: its answer lies together
        (slot,) = holding(engine, A[:40])
        asked = slots.prompt_len[slot]
        assert slots.ranges(slot, asked) <= 2
        again = await ask(h, mid, q, 24)
        assert again[2].usage.cached_tokens == asked - 1
        # the earlier answer is kept in host memory, and the question was read into the cells
        # it first used: asked a third time, the same answer bit for bit
        assert [len(e.tokens) for e in slots.stashed] == [asked + 23]
        assert detok(engine, slots.stashed[0].tokens[asked:]) == first[0][: -len(first[1][-1][0])]
        third = await ask(h, mid, q, 24)
        assert third[:2] == again[:2]
        for sl in range(len(slots.kv)):
            slots.forget(sl)
        slots.clear_stash()
        # the question with another one in the same steps: its answer lies a range per token
        opened = gate_first_step(engine)
        gen = await chat(h, mid, q, sampling=GREEDY, max_tokens=24)
        it = gen.__aiter__()
        await asyncio.wait_for(it.__anext__(), 60)  # its prompt is read; its step waits
        await at_the_gate(opened)
        other = await chat(h, mid, [ChatMessage("user", B)], sampling=GREEDY, max_tokens=24)
        opened.set()
        await transcript(other)
        _ = [d async for d in it]
        (mine,) = holding(engine, A[:40])
        assert slots.ranges(mine, slots.prompt_len[mine]) > 16
        again = await ask(h, mid, q, 24)
        assert again[2].usage.cached_tokens == slots.prompt_len[mine] - 1
        assert holding(engine, A[:40]) == [mine], "it continued in the same slot"
        assert not any(A[:40] in detok(engine, e.tokens) for e in slots.stashed), "not copied"
        assert slots.ranges(mine, slots.prompt_len[mine]) <= 2, "the new answer, decoded alone"


async def test_host_copies_stay_within_the_bound_the_estimate_counts(
    tmp_path: Path, smollm2_path: Path
) -> None:
    """A 512-token cache: its host copies take at most that cache's bytes (the least recently
    used copy goes first), and the memory estimate counts as much."""
    h = hearth(tmp_path / "h", context_length=512)
    model, _ = h.models.import_path(smollm2_path)
    try:
        lm = await h.models.load(model.id)
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
        await h.models.unload(model.id)  # freeing the model gives the copies' memory back
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
    model, _ = h.models.import_path(smollm2_path)
    try:
        lm = await h.models.load(model.id)
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
