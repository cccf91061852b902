"""The llama.cpp runtime on the real SmolLM2 model: probe, fallback template, abort, cancel, UTF-8."""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from pathlib import Path

import pytest

from app.core.library.gguf import read_header
from app.core.library.index import ModelLibrary
from app.core.service import Hearth, assemble
from app.core.types import ChatMessage, LoadOptions, SamplingParams
from app.runtimes.llama import probe as llama_probe
from app.runtimes.llama.admission import PROMPT_PIECE, PROMPT_PIECE_CPU
from app.runtimes.llama.backend import L, build_info, flash_attn_type, physical_cores
from app.runtimes.llama.probe_child import GATE_ENV
from app.runtimes.llama.runtime import LlamaCppRuntime
from tests.conftest import assert_greedy_close, transcript
from tests.support import probes
from tests.support.service_calls import chat, complete

pytestmark = pytest.mark.model


def make_hearth(tmp_path: Path, queue_size: int = 16, **options: object) -> Hearth:
    lib = ModelLibrary(tmp_path / "library.json", tmp_path / "models")
    rt = LlamaCppRuntime(probe_file=probes.shared(), queue_size=queue_size)
    opts = LoadOptions(context_length=4096, **options)  # type: ignore[arg-type]
    return assemble(lib, {"gguf": rt}, load_defaults=lambda: opts)


def assert_close(a: tuple, b: tuple, what: str) -> None:
    """Two greedy (text, logprobs) answers agree as the reuse mode promises: the same text and
    logprobs within the tolerance, unless they part at a near-tie (tests/conftest.py)."""
    if not assert_greedy_close(a[1], b[1], what):
        assert a[0] == b[0], f"{what}: the text changed"


def test_probe_verdict_is_remembered_and_true_to_the_machine(
    tmp_path: Path, smollm2_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(llama_probe.ENV_OVERRIDE, raising=False)
    gate = tmp_path / "gate"  # counts the probe children (each registers here)
    gate.mkdir()
    (gate / "open").touch()
    monkeypatch.setenv(GATE_ENV, str(gate))
    probe_file = tmp_path / "probe.json"
    header = read_header(smollm2_path)
    info = build_info()

    def check(build: str = info) -> bool:
        return llama_probe.Prober(probe_file).check(
            [str(smollm2_path)],
            name="smollm2",
            data_offset=header.data_offset,
            weight_type="Q4_1",
            build_info=build,
            options=LoadOptions(),
            embedding=False,
        )

    verdict = check()
    record = json.loads(probe_file.read_text())
    amx = [v for k, v in record.items() if not k.startswith("file:")]
    files = [v for k, v in record.items() if k.startswith("file:")]
    assert len(amx) == 1 and amx[0]["extra_bufts_ok"] is verdict and amx[0]["weight_type"] == "Q4_1"
    assert len(files) == 1 and files[0]["ok"] is True
    # the verdict matches what a child really does with the default (fast) settings
    res = llama_probe.Prober(None)._run(
        str(smollm2_path), True, LoadOptions(), False, size=smollm2_path.stat().st_size
    )
    assert (res.outcome == "ok") is verdict, res
    n = len(list(gate.glob("*.running")))
    # remembered: no child for a second load
    assert check() is verdict
    assert len(list(gate.glob("*.running"))) == n
    # another llama.cpp build is a different question: one child where the extra buffer types
    # survive, two where they crash (an AMX Xeon: the same question again without them)
    check(info + "x")
    assert len(list(gate.glob("*.running"))) == n + (1 if verdict else 2)


def test_flash_attention_auto_is_off_on_cpu() -> None:
    # llama.cpp's CPU kernel makes every decoded token pay for every cached cell (README:
    # `flash_attention`); with a GPU, llama.cpp's own auto
    assert flash_attn_type("auto") == (-1 if L.llama_supports_gpu_offload() else 0)
    assert (flash_attn_type("on"), flash_attn_type("off")) == (1, 0)


def test_physical_cores_is_sane() -> None:
    import os

    assert 1 <= physical_cores() <= (os.cpu_count() or 1)


def _without_template(src: Path, dst: Path) -> Path:
    """A copy of the model whose chat template key is renamed away (same length, same layout)."""
    shutil.copyfile(src, dst)
    with dst.open("r+b") as f:
        head = f.read(8 << 20)
        i = head.index(b"tokenizer.chat_template")
        f.seek(i)
        f.write(b"tokenizer.chat_templatX")
    return dst


async def test_model_without_template_uses_fallback(tmp_path: Path, smollm2_path: Path) -> None:
    h = make_hearth(tmp_path)
    model, _ = h.models.import_path(_without_template(smollm2_path, tmp_path / "notemplate.gguf"))
    assert model.has_chat_template is False
    try:
        lm = await h.models.load(model.id)
        assert lm.chat_template is None
        gen = await chat(
            h,
            model.id,
            [ChatMessage("system", "Be brief."), ChatMessage("user", "Hello!")],
            sampling=SamplingParams(temperature=0),
            max_tokens=60,
        )
        _c = await gen.collect()
        text, final = _c.text, _c.final
        assert final.finish_reason in ("stop", "length")
        assert "\nUser:" not in text and "\nAssistant:" not in text
        # the documented fallback prompt is what the model saw
        expected = "Be brief.\n\nUser: Hello!\nAssistant:"
        assert gen.prompt_tokens == len(lm.tokenize(expected, add_special=True, parse_special=True))
    finally:
        await h.close()


async def test_long_prompt_aborts_quickly(tmp_path: Path, smollm2_path: Path) -> None:
    """Cancelling during prompt processing stops llama.cpp mid-prompt (abort callback)."""
    h = make_hearth(tmp_path)
    model, _ = h.models.import_path(smollm2_path)
    try:
        await h.models.load(model.id)
        prompt = "The history of the lighthouse is long and full of storms. " * 170  # ~2,000 tokens
        t0 = time.perf_counter()
        gen = await complete(
            h, model.id, prompt, sampling=SamplingParams(temperature=0), max_tokens=1
        )
        _c = await gen.collect()
        text, final = _c.text, _c.final
        full = time.perf_counter() - t0
        assert final.usage is not None and final.usage.prompt_tokens > 1800
        # another prompt (the same one would mostly come from the prompt cache)
        gen = await complete(
            h,
            model.id,
            "Once more: " + prompt,
            sampling=SamplingParams(temperature=0),
            max_tokens=1,
        )
        # a quarter of the way into a prompt as long as the first: under way on any machine
        await asyncio.sleep(full / 4)
        t1 = time.perf_counter()
        gen.cancel()
        _c = await gen.collect()
        _, final2 = _c.text, _c.final
        stopped = time.perf_counter() - t1
        assert final2.finish_reason == "cancelled"
        assert stopped < max(1.0, full / 4), (
            f"abort took {stopped:.2f}s; the whole prompt takes {full:.2f}s"
        )
        # the model still works afterwards
        gen = await complete(
            h, model.id, "Hello", sampling=SamplingParams(temperature=0), max_tokens=3
        )
        _c = await gen.collect()
        text, final = _c.text, _c.final
        assert final.finish_reason == "length" and text
    finally:
        await h.close()


async def test_queued_request_cancelled_before_it_runs(tmp_path: Path, smollm2_path: Path) -> None:
    h = make_hearth(tmp_path)
    model, _ = h.models.import_path(smollm2_path)
    try:
        await h.models.load(model.id)
        first = await complete(
            h, model.id, "Once upon a time", sampling=SamplingParams(temperature=0), max_tokens=60
        )
        second = await complete(
            h, model.id, "Once upon a time", sampling=SamplingParams(temperature=0), max_tokens=60
        )
        second.cancel()
        c1, c2 = await asyncio.gather(first.collect(), second.collect())
        (_t1, f1), (t2, f2) = (c1.text, c1.final), (c2.text, c2.final)
        assert f1.finish_reason == "length" and f1.usage.completion_tokens == 60
        assert f2.finish_reason == "cancelled" and t2 == "" and f2.usage.completion_tokens == 0
    finally:
        await h.close()


async def test_streamed_text_is_whole_utf8(tmp_path: Path, smollm2_path: Path) -> None:
    h = make_hearth(tmp_path)
    model, _ = h.models.import_path(smollm2_path)
    try:
        await h.models.load(model.id)
        gen = await complete(
            h,
            model.id,
            "日本の首都は東京です。大阪は",
            sampling=SamplingParams(temperature=0),
            max_tokens=40,
        )
        pieces = [d.text async for d in gen if d.text]
        text = "".join(pieces)
        assert any(ord(c) > 0x3000 for c in text), text  # the model does answer in Japanese
        assert "\ufffd" not in text, "a multi-byte character was split across tokens and mangled"
    finally:
        await h.close()


async def test_seed_reproducible_and_sampling_params_applied(
    tmp_path: Path, smollm2_path: Path
) -> None:
    """A seed reproduces its sample bit for bit with the exact prompt cache (in reuse mode the
    logits of a cached prompt differ in their last bits, enough to move a random draw)."""
    h = make_hearth(tmp_path, prompt_cache="exact")
    model, _ = h.models.import_path(smollm2_path)
    try:
        await h.models.load(model.id)

        async def run(prompt: str = "My favourite animal is", **kw: object) -> str:
            gen = await complete(h, model.id, prompt, sampling=SamplingParams(**kw), max_tokens=24)
            return (await gen.collect()).text

        a = await run(temperature=1.0, seed=42)
        b = await run(temperature=1.0, seed=42)
        assert a == b
        outs = {await run(temperature=1.5, seed=s) for s in range(4)}
        assert len(outs) > 1, "different seeds should give different samples"
        greedy = await run(temperature=0)
        assert greedy == await run(temperature=0.0001, top_k=1)
        # a prompt greedy decoding keeps repeating, on any CPU; penalties must break the loop
        loop = "The list: cat, cat, cat, cat, cat,"
        greedy = await run(loop, temperature=0)
        penalized = await run(loop, temperature=0, repeat_penalty=1.8, frequency_penalty=1.5)
        assert greedy.count("cat") >= 8, greedy
        assert penalized.count("cat") < greedy.count("cat") / 2, penalized
    finally:
        await h.close()


# -- prompt-prefix cache --------------------------------------------------------------------------


async def _turns(
    h: Hearth, model_id: str, cancel_first: bool = False, fresh: bool = False
) -> list[tuple[str, list, int, int]]:
    """A 3-turn conversation (greedy, logprobs): (text, logprobs, prompt, cached) per turn;
    ``fresh``: each turn on a freshly loaded model (an uncached run)."""
    g = SamplingParams(temperature=0)
    conv = [ChatMessage("user", "Tell me about lighthouses, storms and ships. " * 35)]
    out = []
    if cancel_first:  # a prompt cancelled while being processed leaves no half-written cache
        gen = await chat(h, model_id, conv, sampling=g, max_tokens=5)
        await asyncio.sleep(0.15)
        gen.cancel()
        await gen.collect()
    for turn in range(3):
        if fresh:
            await h.models.unload(model_id)
        gen = await chat(h, model_id, conv, sampling=g, max_tokens=24, logprobs=3)
        text, lps, final = await transcript(gen)
        out.append((text, lps, final.usage.prompt_tokens, final.usage.cached_tokens))
        conv += [
            ChatMessage("assistant", text),
            ChatMessage("user", f"And what happened on day {turn}? " * 12),
        ]
    return out


async def test_prompt_cache_reuses_the_conversation_and_changes_no_bit(
    tmp_path: Path, smollm2_path: Path
) -> None:
    """Exact mode: later turns reuse the earlier prompt's cache, and every logprob equals an
    uncached run's: only whole micro-batches computed as a fresh run computes them are reused."""
    results = {}
    for fresh in (True, False):
        h = make_hearth(tmp_path / str(fresh), prompt_cache="exact", parallel=1)
        model, _ = h.models.import_path(smollm2_path)
        try:
            results[fresh] = await _turns(h, model.id, cancel_first=not fresh, fresh=fresh)
        finally:
            await h.close()
    plain, cached = results[True], results[False]
    assert [c for *_, c in plain] == [0, 0, 0]
    # a prompt is read a piece (one micro-batch) a decode: reuse is in whole pieces
    piece = PROMPT_PIECE if L.llama_supports_gpu_offload() else PROMPT_PIECE_CPU
    assert cached[0][3] == 0 and cached[1][3] >= piece and cached[2][3] >= cached[1][3]
    assert all(c % piece == 0 for *_, c in cached), "reuse is in whole micro-batches"
    for turn, (a, b) in enumerate(zip(plain, cached, strict=True)):
        assert a[0] == b[0] and a[2] == b[2], f"turn {turn}: the text changed"
        assert a[1] == b[1], f"turn {turn}: the logprobs changed by reusing the cache"


async def test_reuse_mode_continues_from_the_whole_prompt_and_answer(
    tmp_path: Path, smollm2_path: Path
) -> None:
    """The default mode: each turn reuses everything the last one left (its prompt and its
    answer, up to where the template renders that answer again), and the greedy answers are
    those of an uncached run, their logprobs within the stated tolerance."""
    results = {}
    for cache in ("off", "reuse"):
        h = make_hearth(tmp_path / cache, prompt_cache=cache)
        model, _ = h.models.import_path(smollm2_path)
        try:
            results[cache] = await _turns(h, model.id, cancel_first=cache == "reuse")
        finally:
            await h.close()
    plain, reused = results["off"], results["reuse"]
    assert reused[0][3] == 0
    for turn in (1, 2):
        # the last turn's prompt and its answer (one logprob entry per token)
        before = reused[turn - 1][2] + len(reused[turn - 1][1])
        assert reused[turn][3] >= before - 1, f"turn {turn} reused {reused[turn][3]} of {before}"
    for turn, (a, b) in enumerate(zip(plain, reused, strict=True)):
        if a[2] != b[2]:
            break  # an earlier answer parted at a near-tie: the conversations differ from here
        assert_close(a, b, f"turn {turn}")


async def test_interleaved_conversations_keep_their_caches(
    tmp_path: Path, smollm2_path: Path
) -> None:
    """Four conversations taking turns: each follow-up reuses its own conversation's cache (a
    slot per conversation in the shared cache), not only the system prompt they share."""
    h = make_hearth(tmp_path, prompt_cache="reuse", parallel=1)
    model, _ = h.models.import_path(smollm2_path)
    g = SamplingParams(temperature=0)
    convs = [
        [ChatMessage("user", f"Meeting {c}. " + f"Item {c} was discussed at length. " * 40)]
        for c in range(4)
    ]
    try:
        firsts = []
        for conv in convs:
            text, _, final = await transcript(
                await chat(h, model.id, conv, sampling=g, max_tokens=12)
            )
            firsts.append(final.usage.prompt_tokens)
            conv += [ChatMessage("assistant", text), ChatMessage("user", "And then?")]
        for conv, first in zip(convs, firsts, strict=True):
            _, _, final = await transcript(await chat(h, model.id, conv, sampling=g, max_tokens=4))
            assert final.usage.cached_tokens > first, "the conversation's own cache was reused"
            assert final.timings is not None and final.timings.cache_n == final.usage.cached_tokens
    finally:
        await h.close()


# -- parallel sequences (continuous batching) -----------------------------------------------------


async def test_parallel_sequences_decode_together_and_match_solo(
    tmp_path: Path, smollm2_path: Path
) -> None:
    """Exact mode with parallel=4: four requests decode in one batch, each in its own cache
    stream (so each keeps the full context), and each answer is bit-identical to a solo run's."""
    prompts = [
        f"Write a short story about a {x}." for x in ("cat", "lighthouse", "dragon", "robot")
    ]

    async def answers(h: Hearth, model_id: str, together: bool) -> list[tuple[str, list]]:
        async def one(p: str) -> tuple[str, list]:
            gen = await chat(
                h,
                model_id,
                [ChatMessage("user", p)],
                sampling=SamplingParams(temperature=0),
                max_tokens=40,
                logprobs=1,
            )
            text, lps, _ = await transcript(gen)
            return text, lps

        if together:
            return list(await asyncio.gather(*(one(p) for p in prompts)))
        return [await one(p) for p in prompts]

    lib = ModelLibrary(tmp_path / "library.json", tmp_path / "models")
    rt = LlamaCppRuntime(probe_file=probes.shared())
    solo_opts = LoadOptions(context_length=1024, parallel=1, prompt_cache="exact")
    solo_h = assemble(lib, {"gguf": rt}, load_defaults=lambda: solo_opts)
    model, _ = solo_h.models.import_path(smollm2_path)
    try:
        solo = await answers(solo_h, model.id, together=False)
    finally:
        await solo_h.close()
    opts = LoadOptions(context_length=1024, parallel=4, prompt_cache="exact")
    h = assemble(lib, {"gguf": rt}, load_defaults=lambda: opts)
    try:
        lm = await h.models.load(model.id)
        assert lm.context_length == 1024, "each sequence keeps the whole context"
        together = await answers(h, model.id, together=True)
        assert lm.engine.peak_batch == 4, "the four requests were decoded in one batch"  # type: ignore[attr-defined]
        assert together == solo
        # a prompt near the full context still fits while others run
        long = "The sea. " * 300
        gens = await asyncio.gather(
            *(
                complete(h, model.id, long + str(i), sampling=SamplingParams(), max_tokens=8)
                for i in range(4)
            )
        )
        finals = [(await g.collect()).final for g in gens]
        assert all(f.finish_reason == "length" and f.usage.prompt_tokens > 900 for f in finals)
    finally:
        await h.close()


async def test_shared_cache_batches_and_matches_solo_within_tolerance(
    tmp_path: Path, smollm2_path: Path
) -> None:
    """The default load: four requests (of up to eight) decode in one batch over one shared
    cache (no more memory than one context), their greedy texts those of solo runs and their
    logprobs within the tolerance; when the shared cache fills, a sequence waits (parked) and
    finishes later."""
    prompts = [
        f"Write a short story about a {x}." for x in ("cat", "lighthouse", "dragon", "robot")
    ]
    g = SamplingParams(temperature=0)

    async def one(h: Hearth, model_id: str, p: str) -> tuple[str, list]:
        # three alternatives: a three-way near-tie is still seen as one (a batch of joining
        # prompts reads them another way than a solo run, and tiny differences pick another)
        gen = await chat(
            h, model_id, [ChatMessage("user", p)], sampling=g, max_tokens=40, logprobs=3
        )
        text, lps, final = await transcript(gen)
        assert final.timings is not None
        return text, lps

    solo_h = make_hearth(tmp_path / "solo", prompt_cache="off", parallel=1)
    model, _ = solo_h.models.import_path(smollm2_path)
    try:
        solo = [await one(solo_h, model.id, p) for p in prompts]
    finally:
        await solo_h.close()
    lib = ModelLibrary(tmp_path / "library.json", tmp_path / "models")
    rt = LlamaCppRuntime(probe_file=probes.shared())
    h = assemble(lib, {"gguf": rt}, load_defaults=lambda: LoadOptions(context_length=1024))
    model, _ = h.models.import_path(smollm2_path)
    try:
        lm = await h.models.load(model.id)
        engine = lm.engine  # type: ignore[attr-defined]
        assert (engine.max_sequences, engine.cache_tokens, lm.context_length) == (8, 1024, 1024)
        together = await asyncio.gather(*(one(h, model.id, p) for p in prompts))
        assert engine.peak_batch == 4, "the four requests were decoded in one batch"
        for i, (a, b) in enumerate(zip(solo, together, strict=True)):
            assert_close(a, b, f"request {i}")
        # four prompts of ~600 tokens cannot all be in a 1,024-token cache: they take turns,
        # waiting in the queue for room (none joins to park another)
        long = "The sea. " * 200
        gens = await asyncio.gather(
            *(complete(h, model.id, long + str(i), sampling=g, max_tokens=8) for i in range(4))
        )
        finals = [(await gen.collect()).final for gen in gens]
        assert all(f.finish_reason == "length" and f.usage.prompt_tokens > 550 for f in finals)
        assert engine.preempted == 0
        # two answers that outgrow the room their admission counted (ANSWER_ROOM tokens): when
        # the cache fills, the younger waits (parked) and finishes later
        eos = int(L.llama_vocab_eos(engine.vocab))
        endless = SamplingParams(temperature=0, logit_bias=((eos, -100.0),))
        grow = "The sea. " * 40
        gens = await asyncio.gather(
            *(complete(h, model.id, grow + str(i), sampling=endless, max_tokens=520)
              for i in range(2))
        )  # fmt: skip
        finals = [(await gen.collect()).final for gen in gens]
        assert all(f.finish_reason == "length" and f.usage.completion_tokens == 520 for f in finals)
        assert engine.preempted > 0, "a sequence waited for room in the shared cache"
    finally:
        await h.close()


async def test_a_long_prompt_does_not_stall_the_streams_already_running(
    tmp_path: Path, smollm2_path: Path
) -> None:
    """With parallel sequences, a joining prompt is read one chunk per step: the running stream
    keeps producing tokens meanwhile, and the joining answer is still the solo one."""
    long = "The keeper climbed the stairs of the lighthouse every night. " * 77  # ~850 tokens
    g = SamplingParams(temperature=0)
    lib = ModelLibrary(tmp_path / "library.json", tmp_path / "models")
    rt = LlamaCppRuntime(probe_file=probes.shared())
    solo_opts = LoadOptions(context_length=4096, parallel=1, prompt_cache="exact")
    h = assemble(lib, {"gguf": rt}, load_defaults=lambda: solo_opts)
    model, _ = h.models.import_path(smollm2_path)
    try:
        solo_text, solo_lps, _ = await transcript(
            await complete(h, model.id, long, sampling=g, max_tokens=8, logprobs=1)
        )
    finally:
        await h.close()
    opts = LoadOptions(context_length=4096, parallel=2, prompt_cache="exact")
    h = assemble(lib, {"gguf": rt}, load_defaults=lambda: opts)
    try:
        await h.models.load(model.id)
        stamps: list[float] = []
        runner = await complete(h, model.id, "Once upon a time", sampling=g, max_tokens=400)

        async def run() -> None:
            async for d in runner:
                if d.text:
                    stamps.append(time.perf_counter())

        task = asyncio.create_task(run())
        while len(stamps) < 3:
            await asyncio.sleep(0.01)
        joined = time.perf_counter()
        gen = await complete(h, model.id, long, sampling=g, max_tokens=8, logprobs=1)
        first: list[float] = []
        text, lps, final = "", [], None
        async for d in gen:
            if d.text and not first:
                first.append(time.perf_counter())
            text += d.text
            lps += [(x.token, x.logprob, x.top) for x in d.logprobs]
            final = d if d.finish_reason else final
        during = [t for t in stamps if joined < t < first[0]]
        assert len(during) >= 4, f"the running stream got {len(during)} tokens meanwhile"
        assert (text, lps) == (solo_text, solo_lps), "chunked reading changed the answer"
        assert final is not None and final.usage is not None and final.usage.prompt_tokens > 800
        runner.cancel()
        await task
    finally:
        await h.close()


async def test_unload_waits_for_a_native_call_from_another_thread(
    tmp_path: Path, smollm2_path: Path
) -> None:
    """The model is freed only after every call other threads make into it has returned, and
    calls after that are refused (a tokenize racing an unload segfaulted)."""
    import threading

    from app.errors import ModelUnloaded

    h = make_hearth(tmp_path)
    model, _ = h.models.import_path(smollm2_path)
    try:
        lm = await h.models.load(model.id)
        engine = lm.engine  # type: ignore[attr-defined]
        entered, release = threading.Event(), threading.Event()
        seen: dict[str, object] = {}

        def native_call_in_flight() -> None:
            with engine.lifetime.hold():  # what tokenize/detokenize/grammar checks do
                entered.set()
                release.wait(60)
                seen["model_alive"] = engine.model is not None and engine.ctx is not None

        caller = threading.Thread(target=native_call_in_flight)
        caller.start()
        await asyncio.to_thread(entered.wait, 60)
        unload = asyncio.ensure_future(h.models.unload(model.id))
        await asyncio.sleep(0.3)
        assert not unload.done(), "the model must not be freed under a running native call"
        release.set()
        assert await asyncio.wait_for(unload, 60) is True
        caller.join(10)
        assert seen["model_alive"] is True
        assert engine.model is None  # freed after the call ended
        with pytest.raises(ModelUnloaded):
            lm.tokenize("hello", add_special=False, parse_special=False)
        with pytest.raises(ModelUnloaded):
            lm.token_pieces([1, 2])
    finally:
        await h.close()


async def test_unload_stops_an_embedding_batch_between_inputs(
    tmp_path: Path, embedding_gguf: Path
) -> None:
    from app.errors import ModelUnloaded

    h = make_hearth(tmp_path)
    model, _ = h.models.import_path(embedding_gguf)
    try:
        lm = await h.models.load(model.id)
        tokens = lm.tokenize("a sentence about cats", add_special=True, parse_special=False)
        batch = asyncio.ensure_future(lm.embed([tokens] * 100_000))  # minutes if left to run
        await asyncio.sleep(0)  # queued on the worker
        t0 = time.monotonic()
        await h.models.unload(model.id)
        with pytest.raises(ModelUnloaded):
            await asyncio.wait_for(batch, 60)
        assert time.monotonic() - t0 < 60
    finally:
        await h.close()


async def test_a_busy_cpu_is_said_in_the_deltas_and_the_timings(
    tmp_path: Path, smollm2_path: Path
) -> None:
    """When the thread tuner moves decoding to fewer threads (other programs keep the CPU busy),
    llama.cpp decodes with that many from the next step, and the stream says why it is slower:
    its deltas and final timings carry cpu_busy and the thread count."""
    from app.runtimes.threads import ThreadTuner

    class BusyMachine(ThreadTuner):  # the tuner's verdict, as on a machine under load
        def observe(self, seconds: float, batch: int, context: int = 0) -> int | None:
            self.current = 1
            return 1

    h = make_hearth(tmp_path, threads=2)
    model, _ = h.models.import_path(smollm2_path)
    try:
        lm = await h.models.load(model.id)
        engine = lm.engine  # type: ignore[attr-defined]
        engine.tuner = BusyMachine(2)
        from app.runtimes.llama.backend import L

        gen = await complete(
            h, model.id, "Once upon a time", sampling=SamplingParams(temperature=0), max_tokens=8
        )
        deltas = [d async for d in gen]
        assert L.llama_n_threads(engine.ctx) == 1, "the tuner's count was applied"
        assert any(d.cpu_busy for d in deltas if d.text)
        t = deltas[-1].timings
        assert t is not None and t.cpu_busy and t.threads == 1
        assert t.as_dict()["cpu_busy"] is True
    finally:
        await h.close()
