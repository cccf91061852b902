"""Prompt scoring on the real server with the real openai client, lm-eval's own logprob parser
and SmolLM2: echo with logprobs over the prompt (max_tokens 0 and 1, strings and token ids),
streamed echo, and vLLM's prompt_logprobs on completions and chat."""

from __future__ import annotations

import json
import math

import pytest

from app.core.requests import CompletionRequest
from app.core.types import SamplingParams
from tests.conftest import Served
from tests.server.clients.test_openai import client, raw_post, sse_events

pytestmark = pytest.mark.model

CONTEXT = "Question: which planet is known as the red planet? Answer:"
CONTINUATIONS = [" Mars", " Venus", " the Moon"]


def _tokens(s: Served, text: str) -> list[int]:
    status, _, body = raw_post(s, "/tokenize", {"model": s.model_id, "content": text})
    assert status == 200
    return list(json.loads(body)["tokens"])


def test_echo_scores_the_prompt_only_with_max_tokens_0(served: Served) -> None:
    c = client(served)
    r = c.completions.create(
        model=served.model_id,
        prompt="The capital of France is Paris.",
        echo=True,
        logprobs=2,
        max_tokens=0,
        temperature=0,
    )
    ch = r.choices[0]
    assert ch.text == "The capital of France is Paris."
    assert ch.finish_reason == "length"
    assert r.usage is not None and r.usage.completion_tokens == 0
    lp = ch.logprobs
    assert lp is not None and lp.tokens and lp.token_logprobs and lp.top_logprobs is not None
    n = len(lp.tokens)
    assert r.usage.prompt_tokens == n
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert all(isinstance(x, float) and x <= 0 for x in lp.token_logprobs[1:])
    assert all(len(t) <= 2 and t for t in lp.top_logprobs[1:])
    assert "".join(lp.tokens) == ch.text
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(n)]


def test_echo_with_one_generated_token_and_a_prompt_list_in_order(served: Served) -> None:
    c = client(served)
    ctx = _tokens(served, CONTEXT)
    prompts = [ctx + _tokens(served, cont) for cont in CONTINUATIONS]
    r = c.completions.create(
        model=served.model_id,
        prompt=prompts,
        echo=True,
        logprobs=1,
        max_tokens=1,
        temperature=0,
        seed=1234,
    )
    assert [ch.index for ch in r.choices] == [0, 1, 2]
    for ch, p in zip(r.choices, prompts, strict=True):
        lp = ch.logprobs
        assert lp is not None and lp.token_logprobs is not None and lp.tokens is not None
        assert len(lp.token_logprobs) == len(p) + 1  # the prompt's and the generated one
        assert lp.token_logprobs[0] is None
        assert ch.text.startswith("".join(lp.tokens[: len(p)]))
        assert lp.text_offset is not None and lp.text_offset[len(p)] == len(
            "".join(lp.tokens[: len(p)])
        )
    # the shared question scores the same in every choice
    first = [ch.logprobs.token_logprobs[: len(ctx)] for ch in r.choices]  # type: ignore[union-attr]
    for other in first[1:]:
        for a, b in zip(first[0][1:], other[1:], strict=True):
            assert a == pytest.approx(b, abs=1e-4)


def test_lm_eval_reads_the_same_loglikelihoods_as_in_process(served: Served) -> None:
    from lm_eval.models.openai_completions import LocalCompletionsAPI

    ctx = _tokens(served, CONTEXT)
    prompts = [ctx + _tokens(served, cont) for cont in CONTINUATIONS]
    body = {
        "model": served.model_id,
        "prompt": prompts,
        "temperature": 0,
        "max_tokens": 1,
        "logprobs": 1,
        "seed": 1234,
        "echo": True,
    }
    status, _, raw = raw_post(served, "/v1/completions", body)
    assert status == 200, raw
    got = LocalCompletionsAPI.parse_logprobs(json.loads(raw), prompts, [len(ctx)] * 3)

    async def in_process() -> list[list[float | None]]:
        service = served.service
        async with service.using(served.model_id) as lm:  # type: ignore[attr-defined]
            scored = await lm.score_prompts(prompts, 1)
        return [[t.logprob for t in s.tokens] for s in scored]

    rows = served.call(in_process(), 120)
    for (ll, greedy), row, p in zip(got, rows, prompts, strict=True):
        expect = sum(x for x in row[len(ctx) :] if x is not None)
        assert ll == pytest.approx(expect, abs=1e-3)
        assert isinstance(greedy, bool)
        assert len(row) == len(p)
    assert math.isfinite(sum(g[0] for g in got))


def test_streamed_echo_sends_the_prompt_in_the_first_chunk(served: Served) -> None:
    body = {
        "model": served.model_id,
        "prompt": "Once upon a time",
        "echo": True,
        "logprobs": 1,
        "max_tokens": 3,
        "temperature": 0,
        "stream": True,
    }
    status, _, raw = raw_post(served, "/v1/completions", body)
    assert status == 200
    events = [json.loads(e) for e in sse_events(raw) if e != "[DONE]"]
    first = events[0]["choices"][0]
    assert first["text"] == "Once upon a time"
    assert first["logprobs"]["token_logprobs"][0] is None
    assert first["logprobs"]["text_offset"][0] == 0
    later = [e["choices"][0] for e in events[1:] if e["choices"] and e["choices"][0]["text"]]
    assert later and later[0]["logprobs"]["text_offset"][0] == len("Once upon a time")


def test_prompt_logprobs_on_completions_and_chat_in_vllms_shape(served: Served) -> None:
    status, _, raw = raw_post(
        served,
        "/v1/completions",
        {
            "model": served.model_id,
            "prompt": "Hello there, friend",
            "prompt_logprobs": 2,
            "max_tokens": 1,
            "temperature": 0,
        },
    )
    assert status == 200, raw
    ch = json.loads(raw)["choices"][0]
    pl = ch["prompt_logprobs"]
    assert ch["text"] and not ch["text"].startswith("Hello")  # no echo
    assert pl[0] is None and len(pl) >= 3
    for place in pl[1:]:
        assert 1 <= len(place) <= 3  # the two most likely and the prompt's own token
        for tid, v in place.items():
            assert int(tid) >= 0
            assert set(v) == {"logprob", "rank", "decoded_token"}
            assert v["logprob"] <= 0 and v["rank"] >= 1
    status, _, raw = raw_post(
        served,
        "/v1/chat/completions",
        {
            "model": served.model_id,
            "messages": [{"role": "user", "content": "Hi"}],
            "prompt_logprobs": 0,
            "max_tokens": 2,
            "temperature": 0,
        },
    )
    assert status == 200, raw
    answer = json.loads(raw)
    pl = answer["prompt_logprobs"]
    assert pl[0] is None
    assert all(len(place) == 1 for place in pl[1:])
    assert len(pl) == answer["usage"]["prompt_tokens"]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"prompt": "x", "max_tokens": 0}, "max_tokens"),
        ({"prompt": "x", "prompt_logprobs": 1, "stream": True}, "prompt_logprobs"),
        ({"prompt": "x", "prompt_logprobs": 21}, "prompt_logprobs"),
    ],
)
def test_scoring_refusals_name_the_field(served: Served, body: dict, param: str) -> None:
    status, _, raw = raw_post(served, "/v1/completions", {"model": served.model_id, **body})
    assert status == 400
    assert json.loads(raw)["error"]["param"] == param


def test_an_echo_answer_is_kept_apart_from_the_plain_one() -> None:
    from app.core.gateway.cache.replay import request_keys

    plain = CompletionRequest("m", ("hi",), SamplingParams(temperature=0), 1)
    echo = CompletionRequest("m", ("hi",), SamplingParams(temperature=0), 1, echo=True)
    scored = CompletionRequest("m", ("hi",), SamplingParams(temperature=0), 1, prompt_logprobs=1)
    keys = {request_keys(r, ["m"])[0] for r in (plain, echo, scored)}
    assert len(keys) == 3
