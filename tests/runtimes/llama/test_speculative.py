"""Speculative decoding by prompt lookup (load option ``speculative`` "ngram", off by default): a
request decoding alone checks drafts taken from its own prompt and answer several tokens a
step, and its answers are those of one-token steps (greedy, seeded, constrained, cut by
max_tokens and stop strings); a request whose drafts stop being kept drafts no more."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from app.core.inference.images import image_tokens
from app.core.library.index import ModelLibrary
from app.core.service import Hearth, assemble
from app.core.types import ChatMessage, Constraint, LoadOptions, SamplingParams
from app.runtimes.llama.runtime import LlamaCppRuntime
from app.runtimes.llama.speculative import DRAFT_FIRST, OFF_AFTER, OFF_SHARE, PAUSE, Drafts
from tests.conftest import assert_greedy_close, transcript
from tests.runtimes.llama.test_mixed_batch import Recorder, at_the_gate, gate_first_step
from tests.support import probes
from tests.support.service_calls import chat

DOC = (
    "The lighthouse stood on the rocks at the edge of the bay. Every night the keeper climbed "
    "the hundred steps, trimmed the wick and lit the great lamp, and every morning he wrote "
    "the weather in his book: the wind, the clouds, the ships that passed. "
)
REPEAT = "Repeat this text exactly:\n\n" + DOC * 2
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 40}, "story": {"type": "string"}},
    "required": ["name", "story"],
}
# (prompt, request options) answered with and without drafts
JOBS: list[tuple[str, dict[str, Any]]] = [
    (REPEAT, {"sampling": SamplingParams(temperature=0), "max_tokens": 120}),
    (REPEAT, {"sampling": SamplingParams(temperature=0), "max_tokens": 21}),  # cut mid-draft
    (REPEAT, {"sampling": SamplingParams(temperature=0), "max_tokens": 120, "stop": ["ships"]}),
    (REPEAT, {"sampling": SamplingParams(temperature=0.8, seed=7), "max_tokens": 80}),
    (
        "Describe the keeper as JSON. " + DOC,
        {
            "sampling": SamplingParams(temperature=0),
            "max_tokens": 80,
            "constraint": Constraint("json_schema", json.dumps(SCHEMA)),
        },
    ),
]


def test_a_draft_is_what_followed_the_last_tokens_before() -> None:
    d = Drafts()
    tokens = [5, 6, 7, 8, 9, 10, 1, 6, 7, 8, 2, 3, 6, 7]
    # "6 7" ends the list; the n-gram is 3 tokens: "3 6 7" never came before
    assert d.propose(tokens, room=10) == []
    tokens += [8]  # "6 7 8": last seen at 7..9, followed by 2 3 6 7 (the first draft: 4)
    assert d.propose(tokens, room=10) == [2, 3, 6, 7]
    assert d.propose(tokens, room=2) == [2, 3]  # no more than the room
    d.kept(4, 4)  # all kept: the next draft may be twice as long
    assert d.size == 2 * DRAFT_FIRST
    d.kept(8, 1)
    assert d.size == DRAFT_FIRST
    # an image's place (a negative token) is never drafted
    img = Drafts()
    assert img.propose([1, 2, 3, -4, -4, 9, 1, 2, 3], room=10) == []
    assert img.propose([1, 2, 3, 4, -4, 9, 1, 2, 3], room=10) == [4]
    # an image's pseudo-ids are as low as -2**62 (core/images.py): they are looked up too
    pic = image_tokens("ab" * 32, 3)
    assert min(pic) < -(2**60)
    assert Drafts().propose([*pic, 7, 8, 1, *pic], room=10) == [7, 8, 1]


def test_one_token_drafts_that_keep_missing_pause_the_lookups() -> None:
    d = Drafts()
    d.size = 1
    d.kept(1, 0)
    tokens = [1, 2, 3, 4, 1, 2, 3]
    assert all(d.propose(tokens, room=5) == [] for _ in range(PAUSE))
    assert d.propose(tokens, room=5) == [4]


def test_a_request_whose_drafts_stop_being_kept_drafts_no_more() -> None:
    """Once OFF_AFTER tokens were drafted and fewer than OFF_SHARE of them kept, the lookups
    stop for the rest of the request, even where a draft would be found; a request whose
    drafts are kept goes on drafting."""
    tokens = [1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3]
    d = Drafts()
    while not d.off:
        draft = d.propose(tokens, room=16)
        if draft:
            d.kept(len(draft), 0)  # every draft missed
        assert d.drafted <= OFF_AFTER + 16, "it never switched off"
    assert d.accepted < OFF_SHARE * d.drafted and d.drafted >= OFF_AFTER
    assert all(d.propose(tokens, room=16) == [] for _ in range(4 * PAUSE))
    good = Drafts()
    for _ in range(20):
        draft = good.propose(tokens, room=16)
        good.kept(len(draft), len(draft))
    assert not good.off and good.propose(tokens, room=16) == [4, 5, 6, 7, 8, 1, 2, 3]
    # a mix that keeps enough of its drafts stays on
    half = Drafts()
    for _ in range(20):
        draft = half.propose(tokens, room=16)
        half.kept(len(draft), (len(draft) + 1) // 2)
    assert not half.off


def test_speculation_is_off_by_default() -> None:
    # on by default it made prose 0.88x as fast on an AMD EPYC (tests/bench/speculative.py)
    assert LoadOptions().speculative == "off"


def hearth(tmp_path: Path, speculative: str | None) -> Hearth:
    lib = ModelLibrary(tmp_path / "library.json", tmp_path / "models")
    rt = LlamaCppRuntime(probe_file=probes.shared())
    chosen = {} if speculative is None else {"speculative": speculative}
    opts = LoadOptions(context_length=2048, **chosen)  # type: ignore[arg-type]
    return assemble(lib, {"gguf": rt}, load_defaults=lambda: opts)


async def answers(tmp_path: Path, model_path: Path, speculative: str | None) -> tuple[list, list]:
    """Each job's (text, logprobs, final delta) on a fresh load (None: the default load); the
    decodes' row counts."""
    h = hearth(tmp_path / (speculative or "default"), speculative)
    model, _ = h.models.import_path(model_path)
    try:
        engine = (await h.models.load(model.id)).engine  # type: ignore[attr-defined]
        rec = Recorder(engine)
        out = []
        for prompt, kw in JOBS:
            gen = await chat(h, model.id, [ChatMessage("user", prompt)], logprobs=3, **kw)
            out.append(await transcript(gen))
        return out, rec.calls
    finally:
        await h.close()


@pytest.mark.model
async def test_drafted_answers_are_those_of_one_token_steps(
    tmp_path: Path, smollm2_path: Path
) -> None:
    plain, plain_calls = await answers(tmp_path, smollm2_path, "off")
    drafted, calls = await answers(tmp_path, smollm2_path, "ngram")
    assert not any(c[2] > 1 for c in plain_calls), "off: one token a step"
    for i, (a, b) in enumerate(zip(plain, drafted, strict=True)):
        what = f"job {i}"
        if not assert_greedy_close(a[1], b[1], what):  # same tokens (up to a near-tie)
            assert a[0] == b[0], f"{what}: the text changed with drafts"
            assert a[2].finish_reason == b[2].finish_reason, what
            assert a[2].usage.completion_tokens == b[2].usage.completion_tokens, what
        assert a[2].timings.draft_n == 0
    # the repeat kept drafts: several tokens a step, and timings say how many
    t = drafted[0][2].timings
    assert t.draft_n_accepted > 10 and t.draft_n >= t.draft_n_accepted
    assert t.as_dict()["draft_n_accepted"] == t.draft_n_accepted
    assert [c for c in calls if len(c[1]) == 1 and c[2] > 1], "steps of one sequence, many rows"
    assert drafted[1][2].usage.completion_tokens == 21 and drafted[1][2].finish_reason == "length"
    assert drafted[2][2].finish_reason == "stop" and "ships" not in drafted[2][0]
    person = json.loads(drafted[4][0])
    assert set(person) == {"name", "story"}


@pytest.mark.model
async def test_requests_decoding_together_take_one_token_steps(
    tmp_path: Path, smollm2_path: Path
) -> None:
    """Drafts are for a request decoding alone: batched, each takes one row a step."""
    h = hearth(tmp_path, "ngram")
    model, _ = h.models.import_path(smollm2_path)
    try:
        engine = (await h.models.load(model.id)).engine  # type: ignore[attr-defined]
        opened = gate_first_step(engine)  # prompts are read in steps too
        rec = Recorder(engine)
        kw: dict[str, Any] = {"sampling": SamplingParams(temperature=0), "max_tokens": 40}
        first = await chat(h, model.id, [ChatMessage("user", REPEAT)], **kw)
        it = first.__aiter__()
        await asyncio.wait_for(it.__anext__(), 60)  # its prompt is read; its first step waits
        await at_the_gate(opened)
        second = await chat(h, model.id, [ChatMessage("user", "Repeat: " + DOC)], **kw)
        opened.set()
        await transcript(second)
        rest = [d async for d in it]
        assert rest[-1].finish_reason == "length"
        together = [c for c in rec.calls if len(c[1]) == 2]  # steps: each prompt was alone
        assert together, "the two decoded together"
        # one output row each (no drafts); the first step may read the second's prompt beside
        assert all(c[2] == 2 for c in together), f"one row each: {together}"
        assert all(c[0] == 2 for c in together[1:]), f"one row each: {together}"
    finally:
        await h.close()
