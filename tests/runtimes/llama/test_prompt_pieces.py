"""Interactive requests first on the real SmolLM2 model (app/runtimes/llama/admission.py and
the worker's queue order): a long prompt is read a piece a decode, so a short request that
arrives meanwhile is read within one piece; a reading that takes longer than the request's
``max_prompt_ms`` ends it; a queued request whose client went away leaves the queue before
its prompt is read. The order is read from the decodes themselves (the engine's llama_decode
calls), never from durations."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.core.library.index import ModelLibrary
from app.core.service import Hearth, assemble
from app.core.types import GenerationRequest, LoadOptions, SamplingParams
from app.runtimes.llama.runtime import LlamaCppRuntime
from tests.conftest import Served
from tests.runtimes.llama.test_mixed_batch import Recorder
from tests.support import probes
from tests.support.service_calls import complete

pytestmark = pytest.mark.model

GREEDY = SamplingParams(temperature=0)
# ~1,500 tokens: several pieces
LONG = "The history of the lighthouse is long and full of storms. " * 120


def hearth(tmp_path: Path, **options: Any) -> Hearth:
    lib = ModelLibrary(tmp_path / "library.json", tmp_path / "models")
    rt = LlamaCppRuntime(probe_file=probes.shared())
    opts = LoadOptions(context_length=4096, **options)
    return assemble(lib, {"gguf": rt}, load_defaults=lambda: opts)


@contextlib.asynccontextmanager
async def beside_a_long_prompt(
    tmp_path: Path, model_path: Path, long_tokens: int, short_prompt: str
) -> AsyncIterator[tuple[Any, Recorder, Any, Any]]:
    """(engine, recorder, long generation, short generation): the long prompt's first piece is
    held at its decode until the short request (8 tokens) is queued."""
    h = hearth(tmp_path)
    model, _ = h.models.import_path(model_path)
    try:
        lm = await h.models.load(model.id)
        engine = lm.engine  # type: ignore[attr-defined]
        reading, queued = threading.Event(), threading.Event()

        def hold(_eng: Any, n: int) -> None:
            if n >= engine.prompt_piece and not reading.is_set():
                reading.set()
                assert queued.wait(120), "the short request never came"

        rec = Recorder(engine, hold)
        long_gen = await complete(h, model.id, LONG, sampling=GREEDY, max_tokens=long_tokens)
        assert await asyncio.to_thread(reading.wait, 120)
        short = await complete(h, model.id, short_prompt, sampling=GREEDY, max_tokens=8)
        queued.set()
        yield engine, rec, long_gen, short
    finally:
        await h.close()


async def test_a_short_request_is_read_within_one_piece_of_a_long_prompt(
    tmp_path: Path, smollm2_path: Path
) -> None:
    """An editor's completion (a few tokens asked for) arrives while a long prompt is read
    alone: the next decode after the piece under way is its prompt, and its first token comes
    before the long prompt's reading ends."""
    beside = beside_a_long_prompt(tmp_path, smollm2_path, 2, "def add(a, b):")
    async with beside as (engine, rec, long_gen, short):
        short_done = await short.collect()
        long_done = await long_gen.collect()
        assert short_done.final.finish_reason in ("length", "stop")
        assert long_done.final.usage.prompt_tokens > 3 * engine.prompt_piece
        long_slot = next(iter(rec.calls[0][1]))
        long_reads = [i for i, c in enumerate(rec.calls) if c[1] == {long_slot} and c[2] < c[0]]
        short_calls = [i for i, c in enumerate(rec.calls) if long_slot not in c[1]]
        assert len(long_reads) > 3, rec.calls  # the long prompt was read in pieces
        # the short prompt's decode came right after the piece under way when it arrived, and
        # its first token (sampled from that decode) long before the long prompt was read
        assert short_calls[0] == long_reads[0] + 1, rec.calls[:6]
        assert short_calls[0] < long_reads[-1], rec.calls


async def test_an_interactive_prompt_of_several_pieces_goes_before_a_long_one(
    tmp_path: Path, smollm2_path: Path
) -> None:
    """An editor's completion whose prompt is longer than a piece arrives while a long prompt
    is read for a long answer: each decode reads one piece, the completion's first, until its
    prompt is read; the long prompt waits (its piece left out of a full decode waits too, not
    read in a decode of its own in the same step)."""
    code = "def add(a, b):\n    return a + b\n\n" * 40  # ~560 tokens: several pieces
    # 65 tokens asked for: the long one is not interactive
    async with beside_a_long_prompt(tmp_path, smollm2_path, 65, code) as (
        engine,
        rec,
        long_gen,
        short,
    ):
        short_done = await short.collect()
        long_gen.cancel()
        assert short_done.final.usage.prompt_tokens > 2 * engine.prompt_piece
        long_slot = next(iter(rec.calls[0][1]))
        reads = [c for c in rec.calls if c[2] < c[0]]  # prompt pieces
        assert all(c[0] <= engine.prompt_piece for c in reads), reads
        short_reads = [i for i, c in enumerate(reads) if long_slot not in c[1]]
        # the held piece, then the completion's pieces one after another
        assert short_reads[:3] == [1, 2, 3], reads[:6]


async def test_max_prompt_ms_ends_a_request_whose_prompt_reads_too_long(
    tmp_path: Path, smollm2_path: Path
) -> None:
    """``max_prompt_ms`` (llama-server's t_max_prompt_ms, which it leaves unimplemented): a
    prompt still being read after that long is read no further, and the request ends with
    "length" and no answer. 0 ms: after its first piece."""
    h = hearth(tmp_path)
    model, _ = h.models.import_path(smollm2_path)
    try:
        lm = await h.models.load(model.id)
        engine = lm.engine  # type: ignore[attr-defined]
        rec = Recorder(engine)
        tokens = engine.tokenize(LONG, add_special=True, parse_special=False)
        stream = lm.submit(
            GenerationRequest(tuple(tokens), max_tokens=4, sampling=GREEDY, max_prompt_ms=0.0)
        )
        deltas = [d async for d in stream]
        final = deltas[-1]
        assert final.finish_reason == "length" and final.usage.completion_tokens == 0
        assert "".join(d.text for d in deltas) == ""
        assert len(rec.calls) == 1 and rec.calls[0][0] == engine.prompt_piece, rec.calls
        # without a limit the same prompt is read whole and answered
        rec.calls.clear()
        again = await complete(h, model.id, LONG, sampling=GREEDY, max_tokens=2)
        done = await again.collect()
        assert done.final.usage.completion_tokens == 2
        assert sum(c[0] for c in rec.calls if c[2] < c[0]) > 3 * engine.prompt_piece
    finally:
        await h.close()


def _pending(served: Served) -> int:
    r = httpx.get(served.root + "/api/v1/ps", timeout=30)
    models = [m for m in r.json()["models"] if m["id"] == served.model_id]
    return models[0]["pending_requests"] if models else 0


async def _wait_for(cond: Any, what: str, timeout: float = 120.0) -> None:
    """Poll ``cond`` (a readiness wait: the generous deadline only bounds a hang)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not await asyncio.to_thread(cond):
        assert asyncio.get_running_loop().time() < deadline, f"never: {what}"
        await asyncio.sleep(0.05)


async def test_a_queued_request_whose_client_went_away_leaves_the_queue_unread(
    served: Served,
) -> None:
    """The one sequence is busy with a long answer; three streamed completions queue behind
    it and their clients close the connections (an editor cancelling stale completions):
    they leave the queue while the long answer still runs, and none of them had a prompt
    read (the engine decoded nothing for them)."""
    load = {"model": served.model_id, "options": {"parallel": 1, "context_length": 2048}}
    r = httpx.post(served.root + "/api/v1/models/load", json=load, timeout=300)
    assert r.status_code == 200, r.text
    lm = served.call(served.service.models.load(served.model_id))  # type: ignore[attr-defined]
    engine = lm.engine
    eos = engine.tokenize("<|im_end|>", add_special=False, parse_special=True)
    rec = Recorder(engine)
    body = {
        "model": served.model_id,
        "prompt": "Count slowly:",
        "max_tokens": 1500,
        "temperature": 0,
        "stream": True,
        "logit_bias": {str(t): -100 for t in eos},  # it never stops before max_tokens
    }
    async with httpx.AsyncClient(base_url=served.base_url, timeout=300) as client:
        async with client.stream("POST", "/completions", json=body) as long_answer:
            lines = long_answer.aiter_lines()
            async for line in lines:  # its first token: it holds the one sequence
                if line.startswith("data: "):
                    break
            calls_before = len(rec.calls)
            short = {**body, "prompt": "def square(x):", "max_tokens": 8, "logit_bias": {}}
            streams = []
            for i in range(3):
                s = client.stream("POST", "/completions", json={**short, "user": f"u{i}"})
                streams.append((s, await s.__aenter__()))
            await _wait_for(lambda: _pending(served) == 4, "the three are queued")
            for s, resp in streams:
                await resp.aclose()
                await s.__aexit__(None, None, None)
            # they leave the queue while the long answer is still being generated (before the
            # change they stayed until it ended, then were admitted one by one)
            await _wait_for(lambda: _queue(lm)[0] == 0, "the queue emptied")
            assert _queue(lm)[1] == [1500], "the long answer ended first"
            assert _pending(served) == 1
            slots = {sl for c in rec.calls[calls_before:] for sl in c[1]}
            assert len(slots) == 1, f"a queued request was decoded: {rec.calls[calls_before:]}"


def _queue(lm: Any) -> tuple[int, list[int | None]]:
    """The worker's queue as one snapshot: requests waiting, and the running ones' max_tokens."""
    w = lm.worker
    with w._cv:
        return len(w._waiting), [s.request.max_tokens for s in w._active]
