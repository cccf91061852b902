"""Prompt scoring on the real SmolLM2 model: every prompt token's log-probability equals the
model's own log-softmax (llama-cpp-python's high-level Llama with every position's logits), and
a prefix shared by several prompts is read once (counted by the tokens the engine decoded)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from app.core.library.index import ModelLibrary
from app.core.service import Hearth, assemble
from app.core.types import GenerationRequest, LoadOptions, SamplingParams
from app.runtimes.llama.runtime import LlamaCppRuntime
from tests.support import probes

pytestmark = pytest.mark.model

QUESTION = "Question: which planet is known as the red planet? Answer:"
ANSWERS = [" Mars", " Venus", " Jupiter, the largest planet"]


def hearth(tmp_path: Path, **options: Any) -> Hearth:
    lib = ModelLibrary(tmp_path / "library.json", tmp_path / "models")
    rt = LlamaCppRuntime(probe_file=probes.shared())
    opts = LoadOptions(context_length=1024, **options)
    return assemble(lib, {"gguf": rt}, load_defaults=lambda: opts)


@pytest.fixture(scope="module")
def reference(smollm2_path: Path) -> Any:
    """Each prompt's per-token log-probabilities and full log-softmax rows, by llama-cpp-python."""
    import llama_cpp

    llm = llama_cpp.Llama(model_path=str(smollm2_path), logits_all=True, n_ctx=1024, verbose=False)

    def score(tokens: list[int]) -> tuple[list[float], np.ndarray]:
        llm.reset()
        llm.eval(tokens)
        s = np.array(llm.scores[: len(tokens)], dtype=np.float64)
        lse = s.max(1) + np.log(np.exp(s - s.max(1)[:, None]).sum(1))
        rows = s - lse[:, None]
        return [float(rows[i, tokens[i + 1]]) for i in range(len(tokens) - 1)], rows

    yield score, llm
    llm.close()


def _check(scored: Any, tokens: list[int], ref: Any, top: int) -> None:
    expect, rows = ref(tokens)
    got = scored.tokens
    assert [t.id for t in got] == tokens
    assert got[0].logprob is None and got[0].rank is None and got[0].top == ()
    for i, t in enumerate(got[1:]):
        assert t.logprob == pytest.approx(expect[i], abs=1e-3), f"token {i + 1}"
        row = rows[i]
        # its rank: the rank-th most likely token is as likely as it (ties may swap)
        assert t.rank is not None
        assert np.sort(row)[::-1][t.rank - 1] == pytest.approx(row[tokens[i + 1]], abs=1e-3)
        assert len(t.top) == top
        best = np.argsort(-row)[:top]
        for (tid, lp), b in zip(t.top, best, strict=True):
            assert lp == pytest.approx(row[b], abs=1e-3)
            assert row[tid] == pytest.approx(row[b], abs=1e-3)


async def test_scores_equal_the_models_log_softmax_and_a_shared_prefix_is_read_once(
    tmp_path: Path, smollm2_path: Path, reference: Any
) -> None:
    ref, llm = reference
    # a cache per sequence: prompts continue on cells read before and share copies of them
    h = hearth(tmp_path, kv_layout="per-sequence")
    model, _ = h.models.import_path(smollm2_path)
    try:
        lm = await h.models.load(model.id)
        text = "The capital of France is Paris, and the capital of Italy is Rome."
        tokens = lm.tokenize(text, add_special=True, parse_special=False)
        [one] = await lm.score_prompts([tokens], 3)  # type: ignore[attr-defined]
        _check(one, tokens, ref, 3)
        assert one.decoded == len(tokens)

        # token ids straight from the reference tokenizer, five alternatives each
        ids = llm.tokenize(b"Once upon a time there was a small robot", add_bos=False)
        [two] = await lm.score_prompts([ids], 5)  # type: ignore[attr-defined]
        _check(two, ids, ref, 5)

        q = lm.tokenize(QUESTION, add_special=True, parse_special=False)
        prompts = [q + lm.tokenize(a, add_special=False, parse_special=False) for a in ANSWERS]
        scored = await lm.score_prompts(prompts, 1)  # type: ignore[attr-defined]
        for s, p in zip(scored, prompts, strict=True):
            _check(s, p, ref, 1)
        # the question is read with the first answer only; each later answer reads its own
        # tokens and the question's last token again (the first new token's row)
        assert scored[0].decoded == len(prompts[0])
        for s, p in zip(scored[1:], prompts[1:], strict=True):
            assert s.decoded == len(p) - len(q) + 1
        # asked again, nothing is decoded
        [again] = await lm.score_prompts([prompts[2]], 1)  # type: ignore[attr-defined]
        assert again.decoded == 0 and again.tokens == scored[2].tokens
    finally:
        await h.close()


async def test_scoring_beside_a_running_generation_and_with_no_prompt_cache(
    tmp_path: Path, smollm2_path: Path, reference: Any
) -> None:
    ref, _ = reference
    h = hearth(tmp_path, prompt_cache="off")
    model, _ = h.models.import_path(smollm2_path)
    try:
        lm = await h.models.load(model.id)
        stream = lm.submit(
            GenerationRequest(
                tuple(lm.tokenize("Tell me a story.", add_special=True, parse_special=False)),
                40,
                SamplingParams(temperature=0),
            )
        )
        it = stream.__aiter__()
        await it.__anext__()  # the generation runs
        q = lm.tokenize(QUESTION, add_special=True, parse_special=False)
        prompts = [q + lm.tokenize(a, add_special=False, parse_special=False) for a in ANSWERS]
        scored = await lm.score_prompts(prompts, 2)  # type: ignore[attr-defined]
        for s, p in zip(scored, prompts, strict=True):
            _check(s, p, ref, 2)
        async for d in it:
            if d.finish_reason is not None:
                assert d.finish_reason == "length"
    finally:
        await h.close()


CHOICES = [" Mars", " Venus", " Jupiter, the largest planet", " Saturn"]


def _close(scored: Any, tokens: list[int], ref: Any) -> None:
    """Its tokens in order, each the model's log-softmax (a prompt continued on cached cells or
    read beside others gives the values of one read whole, alone)."""
    expect, _ = ref(tokens)
    assert [t.id for t in scored.tokens] == tokens
    for i, t in enumerate(scored.tokens[1:]):
        assert t.logprob == pytest.approx(expect[i], abs=1e-3), f"token {i + 1}"


async def test_a_list_of_answers_to_one_question_is_read_in_one_shared_decode(
    tmp_path: Path, smollm2_path: Path, reference: Any
) -> None:
    ref, _ = reference
    h = hearth(tmp_path, kv_layout="per-sequence")
    model, _ = h.models.import_path(smollm2_path)
    try:
        lm = await h.models.load(model.id)
        engine = lm.engine  # type: ignore[attr-defined]

        def tok(text: str, special: bool = False) -> list[int]:
            return lm.tokenize(text, add_special=special, parse_special=False)

        q = tok(QUESTION, True)
        [alone] = await lm.score_prompts([q], 1)  # type: ignore[attr-defined]
        assert alone.decodes == 1 and engine.peak_batch == 1
        prompts = [q + tok(c) for c in CHOICES]
        scored = await lm.score_prompts(prompts, 1)  # type: ignore[attr-defined]
        for s, p in zip(scored, prompts, strict=True):
            _close(s, p, ref)
        # each answer (and the question's last token again, for its first row) is read in
        # one decode, and that decode read all four
        assert [s.decoded for s in scored] == [len(p) - len(q) + 1 for p in prompts]
        assert [s.decodes for s in scored] == [1] * len(prompts)
        assert engine.peak_batch == len(prompts)

        # two new questions, two answers each: each question is read once (in one decode
        # with the other), then the four answers together from copies of its cells
        q2 = tok("Question: what is the capital of France? Answer:", True)
        q3 = tok("Tell me which ocean is the largest one on the Earth. It is the", True)
        mixed = [q2 + tok(" Paris"), q2 + tok(" Lyon"), q3 + tok(" Pacific"), q3 + tok(" Arctic")]
        scored = await lm.score_prompts(mixed, 2)  # type: ignore[attr-defined]
        for s, p in zip(scored, mixed, strict=True):
            _close(s, p, ref)
        assert [s.decodes for s in scored] == [2, 1, 2, 1]
        # (a question may begin as one asked before: those tokens come from the cache)
        assert scored[0].decoded <= len(mixed[0]) and scored[2].decoded <= len(mixed[2])
        assert scored[1].decoded == len(mixed[1]) - len(q2) + 1
        assert scored[3].decoded == len(mixed[3]) - len(q3) + 1
    finally:
        await h.close()


async def test_a_list_longer_than_the_free_slots_is_scored_in_waves_in_order(
    tmp_path: Path, smollm2_path: Path, reference: Any
) -> None:
    ref, _ = reference
    h = hearth(tmp_path, parallel=2)  # 8 sequence slots: 20 prompts take three waves
    model, _ = h.models.import_path(smollm2_path)
    try:
        lm = await h.models.load(model.id)

        def tok(text: str, special: bool = False) -> list[int]:
            return lm.tokenize(text, add_special=special, parse_special=False)

        topics = ["the sea", "a forest", "the moon", "a city", "the desert"]
        prompts = [
            tok(f"A short question about {t}: what comes to mind first? Answer:", True) + tok(a)
            for t in topics
            for a in (" water", " trees and birds", " light", " noise")
        ]
        scored = await lm.score_prompts(prompts, 1)  # type: ignore[attr-defined]
        assert len(scored) == len(prompts)
        for s, p in zip(scored, prompts, strict=True):
            _close(s, p, ref)
        assert lm.engine.peak_batch <= 8  # type: ignore[attr-defined]
    finally:
        await h.close()


async def test_in_a_shared_cache_each_prompt_is_read_whole_and_alone(
    tmp_path: Path, smollm2_path: Path, reference: Any
) -> None:
    """llama.cpp's CPU attention in a shared cache moves a row by up to ~0.9 for a sequence read
    beside others or continued on cells read before (tests/bench/attention_paths.py): there
    each prompt is read whole, with the idle caches out of the cache, and gives the model's own
    values, after other conversations' caches and between answers to one question alike."""
    ref, _ = reference
    h = hearth(tmp_path)  # the default: a shared cache
    model, _ = h.models.import_path(smollm2_path)
    try:
        lm = await h.models.load(model.id)

        def tok(text: str, special: bool = False) -> list[int]:
            return lm.tokenize(text, add_special=special, parse_special=False)

        # other conversations leave their caches behind
        for text in ("Tell me a story about a cat.", "What is two plus two?", "Name a colour."):
            req = GenerationRequest(tuple(tok(text, True)), 6, SamplingParams(temperature=0.0))
            async for _ in lm.submit(req):  # type: ignore[attr-defined]
                pass
        q = tok(QUESTION, True)
        prompts = [q + tok(c) for c in CHOICES]
        listed = await lm.score_prompts(prompts, 1)  # type: ignore[attr-defined]
        one_by_one = [(await lm.score_prompts([p], 1))[0] for p in reversed(prompts)]  # type: ignore[attr-defined]
        for s, p in zip(listed, prompts, strict=True):
            _close(s, p, ref)
            assert s.decoded == len(p)
        for s, p in zip(one_by_one, reversed(prompts), strict=True):
            _close(s, p, ref)
    finally:
        await h.close()
