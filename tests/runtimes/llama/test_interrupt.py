"""An interactive arrival stops the decode in flight (``Interrupts`` in
app/runtimes/llama/admission.py): the C flag llama.cpp's abort callback reads, the bounds on
stopping, and the engine reading an editor's keystroke ahead of a stopped step or prompt piece,
which is decoded again after it. The decode a test needs stopped is held (a gate), so nothing
depends on the machine's speed."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from app.runtimes.llama.admission import Interrupts
from app.runtimes.llama.backend import L, ensure_backend
from tests.bench.autocomplete_mix import CODE
from tests.conftest import assert_greedy_close, transcript
from tests.runtimes.llama.test_mixed_batch import (
    GREEDY,
    LONG,
    LONG_ANSWER,
    PROMPTS,
    Recorder,
    at_the_gate,
    gate_first_step,
    hearth,
    one,
    solo_run,
)
from tests.support.service_calls import complete

pytestmark = pytest.mark.model


class Raw:
    """A bare llama.cpp context of SmolLM2 and a one-sequence batch of made-up tokens."""

    def __init__(self, model_path: Path) -> None:
        ensure_backend()
        self.model = L.llama_model_load_from_file(
            str(model_path).encode(), L.llama_model_default_params()
        )
        cp = L.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_threads, cp.n_threads_batch = 1024, 64, 64, 2, 2
        self.ctx = L.llama_init_from_model(self.model, cp)
        self.mem = L.llama_get_memory(self.ctx)
        self.batch = L.llama_batch_init(64, 0, 1)
        self.pos = 0

    def decode(self, n: int = 32) -> int:
        """Decode ``n`` tokens after what the cache holds; its return code."""
        for i in range(n):
            self.batch.token[i] = 200 + i
            self.batch.pos[i] = self.pos + i
            self.batch.n_seq_id[i] = 1
            self.batch.seq_id[i][0] = 0
            self.batch.logits[i] = int(i == n - 1)
        self.batch.n_tokens = n
        rc = int(L.llama_decode(self.ctx, self.batch))
        if rc == 0:
            self.pos += n
        return rc

    def cached(self) -> int:
        return int(L.llama_memory_seq_pos_max(self.mem, 0)) + 1

    def close(self) -> None:
        L.llama_batch_free(self.batch)
        L.llama_free(self.ctx)
        L.llama_model_free(self.model)


@contextlib.asynccontextmanager
async def an_editors_engine(tmp_path: Path, model_path: Path) -> AsyncIterator[tuple]:
    """The default load, with an editor's last completion (CODE) in a slot: (service, model
    id, engine)."""
    h = hearth(tmp_path / "batched")
    model, _ = h.models.import_path(model_path)
    try:
        lm = await h.models.load(model.id)
        # its prompt stays in a slot (one token: no step, so no step's typical time either)
        await transcript(await complete(h, model.id, CODE, sampling=GREEDY, max_tokens=1))
        yield h, model.id, lm.engine  # type: ignore[attr-defined]
    finally:
        await h.close()


@pytest.fixture
def raw(smollm2_path: Path) -> Iterator[Raw]:
    r = Raw(smollm2_path)
    yield r
    r.close()


def test_an_armed_decode_stops_on_the_flag_and_leaves_the_cache_as_before(raw: Raw) -> None:
    """An arrival while an armed decode runs raises the flag; an armed decode that starts
    while a request waits stops at once (llama_decode returns 2) and llama.cpp takes its
    tokens out of the cache; a decode that is not armed never sees the flag."""
    it = Interrupts(raw.ctx)
    assert it.available
    assert raw.decode() == 0 and raw.cached() == 32
    it.arm("piece")
    assert it.request() and it.raised and it.waiting
    it.disarm()
    assert it.fired and not it.raised, "the flag stayed up after the armed decode"
    assert not it.request() and it.waiting, "raised with no armed decode running"
    assert raw.decode() == 0 and raw.cached() == 64, "a decode not armed was stopped"
    it.arm("piece")
    assert it.raised, "an armed decode started while a request waited, the flag down"
    rc = raw.decode()
    it.disarm()
    assert rc == 2 and it.fired, "the raised flag did not stop the armed decode"
    assert raw.cached() == 64, "the stopped decode's tokens stayed in the cache"
    it.clear()
    assert not it.raised and not it.waiting
    it.arm("piece")
    assert raw.decode() == 0 and raw.cached() == 96, "an armed decode stopped, none waiting"
    it.disarm()
    assert not it.fired


def test_stopping_is_bounded_by_the_work_it_lost_and_by_how_far_the_decode_ran(
    raw: Raw,
) -> None:
    """Once stopped decodes lost their share of the window, an arrival stops nothing (it
    still asks the worker to start nothing more), until the loss leaves the window; and a
    decode that has run past half its kind's typical time is left to end."""
    it = Interrupts(raw.ctx, share=1e-9, window_s=0.5)
    it.arm("step")
    assert it.request(), "nothing was lost yet"
    assert raw.decode() == 2
    it.disarm()
    it.stopped_now()
    assert it.stopped == 1
    it.clear()
    it.arm("step")
    assert not it.request() and not it.raised and it.waiting, "stopped past the bound"
    it.disarm()
    it.clear()
    time.sleep(0.6)  # the loss leaves the window
    it.arm("piece")  # (a kind with no typical time yet: the armed-then-idle step set one)
    assert it.request(), "the loss that left the window still counted"
    it.disarm()
    it.clear()

    it = Interrupts(raw.ctx)
    it.arm("step")
    took = time.monotonic()
    assert raw.decode() == 0
    took = time.monotonic() - took
    it.disarm()  # the typical step: that decode's time
    it.arm("step")  # the next step is under way ...
    time.sleep(took)  # ... and past half its typical time
    assert not it.request() and not it.raised and it.waiting, "stopped past half its time"
    it.disarm()


async def test_a_keystroke_stops_the_streams_step_and_is_read_before_it(
    tmp_path: Path, smollm2_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An editor's completion (interactive; its prompt's prefix in a slot) arrives while a
    stream's step decodes (held at a gate): that decode stops, the completion's rest is read
    in a decode of its own, then the stream's step is decoded again; the stream's answer is
    a solo run's within the greedy tolerance. llama.cpp's lines about the stop are no warning
    or error in Hearth's log."""
    caplog.set_level(logging.INFO, "llama_cpp.native")
    solo = await solo_run(tmp_path, smollm2_path, PROMPTS[0], LONG_ANSWER)
    async with an_editors_engine(tmp_path, smollm2_path) as (h, model_id, engine):
        opened = gate_first_step(engine)
        stream = (await one(h, model_id, PROMPTS[0], LONG_ANSWER)).__aiter__()
        head = await asyncio.wait_for(stream.__anext__(), 60)  # read; its first step waits
        await at_the_gate(opened)
        rec = Recorder(engine)  # from the held step's llama_decode on
        key = await complete(h, model_id, CODE + "    low = ", sampling=GREEDY, max_tokens=8)
        assert engine.interrupts.raised, "the keystroke did not raise the flag"
        opened.set()
        key_text = await asyncio.wait_for(transcript(key), 120)
        rest = [d async for d in stream]
        assert engine.interrupts.stopped == 1
        loud = [r.getMessage() for r in caplog.records if r.name == "llama_cpp.native"]
        assert not loud, f"the stop was logged as a warning or error: {loud}"
        assert key_text[2].usage.cached_tokens > 0
        stopped, after, again = rec.calls[:3]
        assert stopped[0] == 1 and stopped[2] == 1, rec.calls[:3]  # the stream's step
        assert after[1] != stopped[1] and after[2] == 1, (
            f"the keystroke was not read right after the stopped step: {rec.calls[:6]}"
        )
        assert again == stopped, f"the stopped step was not decoded again next: {rec.calls[:6]}"
        got = [(x.token, x.logprob, x.top) for d in [head, *rest] for x in d.logprobs]
        if not assert_greedy_close(solo[1], got, "the stream"):
            assert solo[0] == "".join(d.text for d in [head, *rest]), "the stream's text changed"
        assert rest[-1].usage.completion_tokens == solo[2].usage.completion_tokens


async def test_a_keystroke_stops_a_piece_of_a_long_prompt_which_is_read_again_after_it(
    tmp_path: Path, smollm2_path: Path
) -> None:
    """An editor's completion arrives while a piece of a long prompt decodes (held before its
    llama_decode): the piece stops, the completion's rest is read next, and the piece is read
    again after it; the long prompt's answer is a solo run's within the greedy tolerance."""
    solo = await solo_run(tmp_path, smollm2_path, LONG, LONG_ANSWER)
    async with an_editors_engine(tmp_path, smollm2_path) as (h, model_id, engine):
        reached, go, pieces = threading.Event(), threading.Event(), []

        def hold_the_second_piece(engine: Any, n: int) -> None:
            if n == engine.prompt_piece:
                pieces.append(n)
                if len(pieces) == 2:
                    # how long a piece takes is not known yet: the hold is not its run time
                    engine.interrupts._typical.clear()
                    reached.set()
                    go.wait(60)

        rec = Recorder(engine, hold_the_second_piece)
        long = await one(h, model_id, LONG, LONG_ANSWER)
        assert await asyncio.to_thread(reached.wait, 60), "the long prompt's piece never came"
        key = await complete(h, model_id, CODE + "    low = ", sampling=GREEDY, max_tokens=8)
        assert engine.interrupts.raised, "the keystroke did not raise the flag"
        go.set()
        await asyncio.wait_for(transcript(key), 120)
        got = await asyncio.wait_for(transcript(long), 120)
        assert engine.interrupts.stopped == 1
        first, stopped, read = rec.calls[:3]
        assert first[0] == stopped[0] == engine.prompt_piece and first[1] == stopped[1]
        assert read[1] != stopped[1] and read[2] == 1, (
            f"the keystroke was not next: {rec.calls[:5]}"
        )
        # then the keystroke's own step, and the long prompt's pieces from the stopped one on
        # (its answer below is whole only if that piece is read again)
        assert stopped in rec.calls[3:], rec.calls[:6]
        if not assert_greedy_close(solo[1], got[1], "the long prompt's answer"):
            assert solo[0] == got[0], "the long prompt's answer changed"
        assert got[2].usage.prompt_tokens == solo[2].usage.prompt_tokens
        assert got[2].usage.completion_tokens == solo[2].usage.completion_tokens


class _Seq:
    """What ``Interrupts`` reads of a sequence: its stream, and whether it was cancelled."""

    def __init__(self) -> None:
        self.stream, self.cancelled = object(), False


def test_a_cancel_stops_the_armed_decode_that_reads_its_sequence(raw: Raw) -> None:
    """A cancel raises the flag while a decode that reads the cancelled sequence is armed (any
    kind), not for another sequence's decode; a decode armed only for cancels (an image's
    positions: no kind) is not stopped by an arrival; one armed after its sequence was
    cancelled stops at once."""
    it = Interrupts(raw.ctx)
    mine, other = _Seq(), _Seq()
    it.arm("", (mine,))
    assert not it.request() and not it.raised, "an arrival stopped a decode armed for cancels"
    it.cancel(other.stream)
    assert not it.raised, "another sequence's cancel raised the flag"
    it.cancel(mine.stream)
    assert it.raised
    assert raw.decode() == 2 and raw.cached() == 0
    it.disarm()
    assert it.fired and not it.raised
    it.clear()
    it.cancel(mine.stream)
    assert not it.raised, "a cancel raised the flag with no decode armed"
    mine.cancelled = True
    it.arm("piece", (mine,))
    assert it.raised, "a decode of a cancelled sequence was armed with the flag down"
    it.disarm()


async def test_a_cancel_stops_the_prompt_piece_in_flight(
    tmp_path: Path, smollm2_path: Path
) -> None:
    """A long prompt's request is cancelled while a piece of its prompt decodes (held before
    its llama_decode): that decode stops at once rather than after its piece, no piece of it
    is read after, and the next request is served from a consistent cache."""
    async with an_editors_engine(tmp_path, smollm2_path) as (h, model_id, engine):
        reached, go, pieces, rcs = threading.Event(), threading.Event(), [], []

        def hold_the_second_piece(engine: Any, n: int) -> None:
            if n == engine.prompt_piece:
                pieces.append(n)
                if len(pieces) == 2:
                    reached.set()
                    go.wait(60)

        Recorder(engine, hold_the_second_piece)
        decode = engine._decode

        def recording(batch: Any = None) -> int:
            rc = decode(batch)
            rcs.append(rc)
            return rc

        engine._decode = recording
        long = await one(h, model_id, LONG, LONG_ANSWER)
        assert await asyncio.to_thread(reached.wait, 60), "the long prompt's piece never came"
        long.cancel()
        go.set()
        async for _ in long:  # its end, as a cancelled generation
            pass
        key = await complete(h, model_id, CODE + "    low = ", sampling=GREEDY, max_tokens=8)
        text, _, final = await asyncio.wait_for(transcript(key), 120)
        assert rcs[1] == 2, f"the cancelled request's piece was decoded to its end: {rcs}"
        assert len(pieces) == 2, f"pieces of the cancelled prompt were read after: {pieces}"
        assert final.finish_reason in ("stop", "length") and final.usage.cached_tokens > 0
