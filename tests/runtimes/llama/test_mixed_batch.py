"""Prompts that join running streams are read together (llama-server reads new prompts in one
batch), not in a decode of their own each: prompts whose rest is short ride in the streams' own
step (under 64 rows, where llama.cpp's CPU attention computes each row as in a step of the
streams alone); longer ones are read after it, one llama_decode carrying the next pieces of the
joining prompts, the shortest first (a much longer one waits for a later decode). The tests hold
the first decode step at a gate until the others have joined, so they do not depend on the
machine's speed."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from app.core.library.index import ModelLibrary
from app.core.service import Hearth, assemble
from app.core.types import ChatMessage, LoadOptions, SamplingParams
from app.runtimes.llama.runtime import LlamaCppRuntime
from tests.conftest import assert_greedy_close, transcript
from tests.support import probes
from tests.support.service_calls import chat, complete

pytestmark = pytest.mark.model

GREEDY = SamplingParams(temperature=0)
PROMPTS = [f"Write a short story about a {x}." for x in ("cat", "lighthouse", "dragon", "robot")]
LONG = "The keeper climbed the stairs of the lighthouse every night. " * 40  # ~500 tokens
MID = "The keeper climbed the stairs of the lighthouse every night. " * 16  # ~200 tokens
# a chat prompt of ~150 tokens: read in one decode with MID (within twice its length)
LONG_ANSWER = 72  # tokens: over INTERACTIVE_MAX_TOKENS, so not an interactive request
NOTE = "Here is a note. " + "The harbor was quiet at dawn and the boats slept. " * 11 + PROMPTS[1]


def hearth(tmp_path: Path, **options: Any) -> Hearth:
    lib = ModelLibrary(tmp_path / "library.json", tmp_path / "models")
    rt = LlamaCppRuntime(probe_file=probes.shared())
    opts = LoadOptions(context_length=2048, **options)
    return assemble(lib, {"gguf": rt}, load_defaults=lambda: opts)


class Recorder:
    """Wraps an engine's llama_decode: each call's (tokens, sequence ids, output rows), and
    an optional hook that runs on the worker thread just before the call."""

    def __init__(self, engine: Any, hook: Any = None) -> None:
        self.calls: list[tuple[int, frozenset[int], int]] = []
        self.engine = engine
        self.hook = hook
        real = engine._decode

        def decode(batch: Any = None) -> int:
            b = engine.batch if batch is None else batch
            n = int(b.n_tokens)
            seqs = frozenset(int(b.seq_id[i][0]) for i in range(n))
            self.calls.append((n, seqs, sum(int(b.logits[i]) for i in range(n))))
            if self.hook is not None:
                self.hook(engine, n)
            return real(batch)

        engine._decode = decode


class Gate(threading.Event):
    """Set: the gated step goes on. ``reached``: the worker is waiting at it (whatever is
    submitted from then on is admitted together, after it)."""

    def __init__(self) -> None:
        super().__init__()
        self.reached = threading.Event()


def gate_first_step(engine: Any) -> Gate:
    """The first pure decode step (drafted or not) waits until the returned event is set."""
    opened = Gate()
    for name in ("_speculate", "_decode_step"):
        real = getattr(engine, name)

        def gated(*args: Any, real: Any = real) -> Any:
            opened.reached.set()
            assert opened.wait(120), "the test never opened the gate"
            return real(*args)

        setattr(engine, name, gated)
    return opened


async def at_the_gate(opened: Gate) -> None:
    """Wait until the worker waits at the gate: a request submitted before that could join the
    step the gate holds back (the worker checks its queue on the way there)."""
    assert await asyncio.to_thread(opened.reached.wait, 60), "the worker never reached the gate"


def wait_after_a_read(engine: Any, which: Any) -> tuple[threading.Event, list[bool], Recorder]:
    """After a joining prompt's rest is read (``_rode``), the first decode of ``which(n)``
    tokens waits until the returned event is set (60 s at most): ``waited`` says whether it was
    set in time, i.e. whether what the test awaits reached it before that decode."""
    sent, waited, read = threading.Event(), [], threading.Event()

    def hook(_engine: Any, n: int) -> None:
        if read.is_set() and which(n) and not waited:
            waited.append(sent.wait(60))

    rec = Recorder(engine, hook)
    real_rode = engine._rode

    def rode(riders: Any, row: int) -> None:
        real_rode(riders, row)
        read.set()

    engine._rode = rode
    return sent, waited, rec


@contextlib.asynccontextmanager
async def a_held_stream(tmp_path: Path, model_path: Path, which: Any) -> AsyncIterator[tuple]:
    """A batched service with a stream (long answer) whose prompt is read and whose first step
    waits for the gate: (service, model id, the stream's iterator, the gate, and
    ``wait_after_a_read``'s event, outcome and recorder for decodes of ``which(n)`` tokens)."""
    h = hearth(tmp_path / "batched")
    model, _ = h.models.import_path(model_path)
    try:
        lm = await h.models.load(model.id)
        engine = lm.engine  # type: ignore[attr-defined]
        opened = gate_first_step(engine)
        sent, waited, rec = wait_after_a_read(engine, which)
        it = (await one(h, model.id, PROMPTS[0], LONG_ANSWER)).__aiter__()
        await asyncio.wait_for(it.__anext__(), 60)  # its prompt is read; step 1 waits
        await at_the_gate(opened)
        yield h, model.id, it, opened, sent, waited, rec
    finally:
        await h.close()


async def solo_run(tmp_path: Path, model_path: Path, prompt: str, max_tokens: int) -> Any:
    """The transcript of ``prompt`` answered alone: one sequence, no prompt cache."""
    h = hearth(tmp_path / "solo", parallel=1, prompt_cache="off")
    model, _ = h.models.import_path(model_path)
    try:
        return await transcript(await one(h, model.id, prompt, max_tokens))
    finally:
        await h.close()


async def one(h: Hearth, model_id: str, prompt: str, max_tokens: int = 24) -> Any:
    return await chat(
        h, model_id, [ChatMessage("user", prompt)], sampling=GREEDY, max_tokens=max_tokens,
        logprobs=3,
    )  # fmt: skip


async def test_short_joining_prompts_ride_in_the_streams_step(
    tmp_path: Path, smollm2_path: Path
) -> None:
    """Three short questions with long answers (not interactive) join a running stream: their
    prompts are read in the stream's next decode (one llama_decode of its token and their
    prompts, four output rows), and each answer is a solo run's within the greedy tolerance."""
    solo_h = hearth(tmp_path / "solo", parallel=1, prompt_cache="off")
    model, _ = solo_h.models.import_path(smollm2_path)
    try:
        solo = [await transcript(await one(solo_h, model.id, PROMPTS[0]))]
        solo += [await transcript(await one(solo_h, model.id, p, LONG_ANSWER)) for p in PROMPTS[1:]]
    finally:
        await solo_h.close()
    h = hearth(tmp_path / "batched")  # the default load: reuse cache, shared, parallel 8
    model, _ = h.models.import_path(smollm2_path)
    try:
        lm = await h.models.load(model.id)
        engine = lm.engine  # type: ignore[attr-defined]
        opened = gate_first_step(engine)
        rec = Recorder(engine)
        first = await one(h, model.id, PROMPTS[0])
        it = first.__aiter__()
        head = await asyncio.wait_for(it.__anext__(), 60)  # its prompt is read; step 1 waits
        await at_the_gate(opened)
        others = [await one(h, model.id, p, LONG_ANSWER) for p in PROMPTS[1:]]
        opened.set()
        rest = [d async for d in it]
        results = [
            (
                "".join(d.text for d in [head, *rest]),
                [(x.token, x.logprob, x.top) for d in [head, *rest] for x in d.logprobs],
                rest[-1],
            )
        ] + [await transcript(g) for g in others]
        together = [c for c in rec.calls if len(c[1]) == 4 and c[0] > 4 and c[2] == 4]
        assert together, f"the prompts did not ride in the stream's step: {rec.calls[:8]}"
        # before it, only the first request's own prompt was decoded: the others' prompts had
        # no decodes of their own, and the stream no step without them
        before = rec.calls[: rec.calls.index(together[0])]
        assert all(len(c[1]) == 1 for c in before), before
        for i, (a, b) in enumerate(zip(solo, results, strict=True)):
            if not assert_greedy_close(a[1], b[1], f"request {i}"):
                assert a[0] == b[0], f"request {i}: the text changed in a mixed batch"
        assert all(r[2].usage.completion_tokens == s[2].usage.completion_tokens
                   for r, s in zip(results, solo, strict=True))  # fmt: skip
        assert engine.peak_batch == 4  # then the four streams decoded together
    finally:
        await h.close()


async def test_an_interactive_prompt_is_read_ahead_of_the_streams_step_and_sent_at_once(
    tmp_path: Path, smollm2_path: Path
) -> None:
    """A short question with a short answer (interactive: an editor's completion) joins a
    running stream: its rest is read in a decode of its own (its rows only, one output row)
    before the stream's step, and its first token reaches the caller before that step
    decodes; the answer is a solo run's within the greedy tolerance."""
    solo_h = hearth(tmp_path / "solo", parallel=1, prompt_cache="off")
    model, _ = solo_h.models.import_path(smollm2_path)
    try:
        solo = await transcript(await one(solo_h, model.id, PROMPTS[1], 8))
    finally:
        await solo_h.close()
    # the decode after the question's own waits (60 s at most) for its first token
    async with a_held_stream(tmp_path, smollm2_path, lambda n: True) as held:
        h, mid, it, opened, sent, waited, rec = held
        question = (await one(h, mid, PROMPTS[1], 8)).__aiter__()
        opened.set()
        head = await asyncio.wait_for(question.__anext__(), 120)
        sent.set()
        rest = [d async for d in question]
        got = ("".join(d.text for d in [head, *rest]),
               [(x.token, x.logprob, x.top) for d in [head, *rest] for x in d.logprobs])  # fmt: skip
        [d async for d in it]
        assert waited == [True], "the first token waited for the stream's step"
        alone = [c for c in rec.calls if len(c[1]) == 1 and c[0] > 1 and c[2] == 1]
        assert alone, f"the question was not read in a decode of its own: {rec.calls[:8]}"
        assert rec.calls[rec.calls.index(alone[0]) + 1][0] == 1  # then the stream's step
        assert not [c for c in rec.calls if len(c[1]) == 2 and c[2] == 2 and c[0] > 2]  # no ride
        if not assert_greedy_close(solo[1], got[1], "the question"):
            assert solo[0] == got[0], "the text changed"


async def test_a_steps_tokens_are_sent_before_a_joining_prompts_piece_is_read(
    tmp_path: Path, smollm2_path: Path
) -> None:
    """A short question rides in a running stream's step while a long prompt joins too: the
    question's first token (and the stream's) reach their callers before the long prompt's
    next piece decodes, not after it (a piece of 64 tokens: ~0.3 s on 2 cores)."""
    # the long prompt's piece after the ride waits (60 s at most) for the rider's token
    async with a_held_stream(tmp_path, smollm2_path, lambda n: n >= 32) as held:
        h, mid, it, opened, sent, waited, _ = held
        question = (await one(h, mid, PROMPTS[1], LONG_ANSWER)).__aiter__()
        long = await one(h, mid, LONG, LONG_ANSWER)
        opened.set()
        await asyncio.wait_for(question.__anext__(), 120)
        sent.set()
        for g in (question, it, long.__aiter__()):
            [d async for d in g]
        assert waited == [True], "the rider's first token waited for the long prompt's piece"


async def test_a_joining_prompt_cancelled_mid_read_leaves_the_others_whole(
    tmp_path: Path, smollm2_path: Path
) -> None:
    """A long prompt is cancelled while its first piece decodes beside another joining prompt
    (it stops before its next piece): the running stream and the other prompt go on with the
    answers solo runs give, and the long prompt asked again reads from a cache that holds
    nothing half-written."""
    solo_h = hearth(tmp_path / "solo", parallel=1, prompt_cache="off")
    model, _ = solo_h.models.import_path(smollm2_path)
    try:
        solo_run = await transcript(await one(solo_h, model.id, PROMPTS[0], 32))
        solo_other = await transcript(await one(solo_h, model.id, NOTE, 16))
        solo_long = await transcript(
            await complete(solo_h, model.id, MID, sampling=GREEDY, max_tokens=8, logprobs=3)
        )
    finally:
        await solo_h.close()
    h = hearth(tmp_path / "batched", ubatch_size=128)  # several micro-batches per decode
    model, _ = h.models.import_path(smollm2_path)
    try:
        lm = await h.models.load(model.id)
        engine = lm.engine  # type: ignore[attr-defined]
        opened = gate_first_step(engine)
        mid_start = engine.tokenize(MID, add_special=True, parse_special=False)[:4]
        cancelled: list[int] = []
        joiner: Any = None

        def cancel_the_joiner(eng: Any, n: int) -> None:
            first = [int(eng.batch.token[i]) for i in range(min(n, 4))]
            if first == mid_start and not cancelled:  # the long joiner's first piece
                cancelled.append(n)
                joiner.cancel()

        rec = Recorder(engine, cancel_the_joiner)
        running = await one(h, model.id, PROMPTS[0], 32)
        it = running.__aiter__()
        head = await asyncio.wait_for(it.__anext__(), 60)
        await at_the_gate(opened)
        joiner = await complete(h, model.id, MID, sampling=GREEDY, max_tokens=8, logprobs=3)
        other = await one(h, model.id, NOTE, 16)
        opened.set()
        rest = [d async for d in it]
        got = [d async for d in joiner]
        other_run = await transcript(other)
        # cancelled within its prompt: a piece of it was read, not all of it
        assert cancelled and cancelled[0] < len(mid_start) + 200, rec.calls[:8]
        assert got[-1].finish_reason == "cancelled"
        lps = [(x.token, x.logprob, x.top) for d in [head, *rest] for x in d.logprobs]
        if not assert_greedy_close(solo_run[1], lps, "the running stream"):
            assert "".join(d.text for d in [head, *rest]) == solo_run[0]
        if not assert_greedy_close(solo_other[1], other_run[1], "the other joiner"):
            assert other_run[0] == solo_other[0]
        again = await transcript(
            await complete(h, model.id, MID, sampling=GREEDY, max_tokens=8, logprobs=3)
        )
        if not assert_greedy_close(solo_long[1], again[1], "the prompt asked again"):
            assert again[0] == solo_long[0]
        assert lm.pending == 0
    finally:
        await h.close()


async def test_a_short_prompt_is_read_before_a_long_one_that_joins_with_it(
    tmp_path: Path, smollm2_path: Path
) -> None:
    """Joining prompts are read the shortest first, and a much longer one waits for a later
    decode: a short question is not read behind ~500 tokens of another prompt (it has a short
    answer, so it is read in a decode of its own ahead of the running stream's step)."""
    h = hearth(tmp_path)
    model, _ = h.models.import_path(smollm2_path)
    try:
        lm = await h.models.load(model.id)
        engine = lm.engine  # type: ignore[attr-defined]
        opened = gate_first_step(engine)
        running = await one(h, model.id, PROMPTS[0], 8)
        it = running.__aiter__()
        await asyncio.wait_for(it.__anext__(), 60)  # its prompt is read; its step waits
        await at_the_gate(opened)
        rec = Recorder(engine)
        joiner = await complete(h, model.id, LONG, sampling=GREEDY, max_tokens=4)
        short = await one(h, model.id, PROMPTS[1], 4)
        opened.set()
        [d async for d in it]
        await transcript(short)
        await joiner.collect()
        reads = [c for c in rec.calls if c[2] < c[0]]  # prompt decodes: fewer output rows
        # first the short prompt alone (one output row), then the long prompt in decodes of
        # its own
        first, later = reads[0], reads[1:]
        assert first[0] < 64 and first[2] == len(first[1]) == 1, f"short first: {reads[:3]}"
        assert all(len(c[1]) == 1 for c in later), "the long prompt in decodes of its own"
        assert sum(c[0] for c in later) > 400, reads
    finally:
        await h.close()


async def test_text_prompts_are_read_without_the_abort_callback(
    tmp_path: Path, smollm2_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """llama.cpp calls the abort callback once per graph node, a Python call each (it doubled
    a short prompt's decode): a text prompt is read a piece a decode, and a cancel is seen
    before the next piece (test_runtime.py's abort test), so no piece runs under it."""
    from app.runtimes.llama import engine as llama_engine

    h = hearth(tmp_path)
    model, _ = h.models.import_path(smollm2_path)
    try:
        lm = await h.models.load(model.id)
        engine = lm.engine  # type: ignore[attr-defined]
        armed: list[int] = []
        real = llama_engine.L.llama_set_abort_callback

        def set_callback(ctx: Any, cb: Any, data: Any) -> None:
            if cb is engine._abort_cb:
                armed.append(1)
            real(ctx, cb, data)

        monkeypatch.setattr(llama_engine.L, "llama_set_abort_callback", set_callback)
        short = await transcript(await one(h, model.id, "Hi", 2))
        assert short[2].usage.prompt_tokens - short[2].usage.cached_tokens < 64
        assert armed == [], "a short prompt decoded under the abort callback"
        rec = Recorder(engine)
        await transcript(
            await complete(h, model.id, LONG, sampling=GREEDY, max_tokens=2, logprobs=3)
        )
        assert armed == [], "a long prompt decoded under the abort callback"
        reads = [c[0] for c in rec.calls if c[2] < c[0]]
        assert len(reads) > 1 and max(reads) <= engine.prompt_piece, reads
    finally:
        await h.close()


async def test_per_sequence_steps_list_the_streams_in_order(
    tmp_path: Path, smollm2_path: Path
) -> None:
    """With a cache stream per sequence, llama.cpp puts sequences in one micro-batch only when
    their ids follow each other in the batch (else each run of them is a compute of its own):
    a step lists its sequences by slot, whatever order they came in."""
    h = hearth(tmp_path, parallel=4, kv_layout="per-sequence")
    model, _ = h.models.import_path(smollm2_path)
    try:
        lm = await h.models.load(model.id)
        engine = lm.engine  # type: ignore[attr-defined]
        rec = Recorder(engine)
        order: list[list[int]] = []
        real = engine._decode

        def decode(batch: Any = None) -> int:
            b = engine.batch if batch is None else batch
            order.append([int(b.seq_id[i][0]) for i in range(int(b.n_tokens))])
            return real(batch)

        engine._decode = decode

        async def run(prompt: str) -> Any:
            return await transcript(await one(h, model.id, prompt, 12))

        for rnd in range(3):  # later rounds find the slots in another order
            prompts = [f"{p} ({rnd})" for p in (PROMPTS if rnd % 2 else PROMPTS[::-1])]
            await asyncio.gather(*(run(p) for p in prompts))
        steps = [o for o in order if len(o) > 1 and len(set(o)) == len(o)]
        assert steps and rec.calls
        assert all(o == sorted(o) for o in steps), [o for o in steps if o != sorted(o)][:3]
        assert any(len(o) == 4 for o in steps)
    finally:
        await h.close()
