"""The MLX runtime for real (mlx[cpu] here), on a tiny model the tests build, through the server."""

from __future__ import annotations

import concurrent.futures
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.conftest import Served, serving, transcript
from tests.support.service_calls import chat, complete

pytest.importorskip("mlx_lm", reason="MLX runtime tests need mlx-lm (and mlx[cpu] on Linux)")


@pytest.fixture(scope="module")
def tiny_mlx(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.support.mlx_model import build_tiny_mlx_model

    return build_tiny_mlx_model(tmp_path_factory.mktemp("mlx") / "Tiny-MLX-Llama")


@pytest.fixture(scope="module")
def mlx_served(tmp_path_factory: pytest.TempPathFactory, tiny_mlx: Path) -> Iterator[Served]:
    with serving(tmp_path_factory.mktemp("mlxserved"), tiny_mlx) as s:
        yield s


def client(s: Served) -> openai.OpenAI:
    return openai.OpenAI(base_url=s.base_url, api_key="x", max_retries=0, timeout=120)


def test_cli_imports_an_mlx_folder(tmp_path: Path, tiny_mlx: Path) -> None:
    env = {**os.environ, "HEARTH_HOME": str(tmp_path / "h")}
    r = subprocess.run(
        [sys.executable, "-m", "app", "import", str(tiny_mlx)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "tiny-mlx-llama"
    ls = json.loads(
        subprocess.run(
            [sys.executable, "-m", "app", "ls", "--json"],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        ).stdout
    )
    assert (
        ls[0]["format"] == "mlx" and ls[0]["architecture"] == "llama" and ls[0]["has_chat_template"]
    )


def test_chat_and_completion_through_the_server(mlx_served: Served) -> None:
    c = client(mlx_served)
    m = c.models.retrieve(mlx_served.model_id).model_dump()
    assert m["format"] == "mlx"
    msgs = [{"role": "user", "content": "hello world"}]
    a = c.chat.completions.create(
        model=mlx_served.model_id, messages=msgs, max_tokens=12, temperature=0
    )
    b = c.chat.completions.create(
        model=mlx_served.model_id, messages=msgs, max_tokens=12, temperature=0
    )
    assert a.choices[0].message.content == b.choices[0].message.content, "greedy is deterministic"
    assert a.usage.completion_tokens == 12 and a.choices[0].finish_reason == "length"
    assert c.models.retrieve(mlx_served.model_id).model_dump()["runtime"] == "mlx"
    chunks = list(
        c.chat.completions.create(
            model=mlx_served.model_id,
            messages=msgs,
            max_tokens=12,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert (
        "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        == a.choices[0].message.content
    )
    assert chunks[-1].usage.completion_tokens == 12
    comp = c.completions.create(
        model=mlx_served.model_id, prompt="the quick brown", max_tokens=6, temperature=0
    )
    assert comp.usage.completion_tokens == 6
    s1 = c.completions.create(
        model=mlx_served.model_id, prompt="the sea", max_tokens=8, temperature=1.0, seed=7
    )
    s2 = c.completions.create(
        model=mlx_served.model_id, prompt="the sea", max_tokens=8, temperature=1.0, seed=7
    )
    assert s1.choices[0].text == s2.choices[0].text, "a seed makes sampling reproducible"


def test_concurrent_requests_queue_and_match_solo(mlx_served: Served) -> None:
    kw = dict(model=mlx_served.model_id, prompt="a cat sits", max_tokens=16, temperature=0)
    solo = client(mlx_served).completions.create(**kw).choices[0].text

    def one(_: int) -> str:
        return "".join(
            ch.choices[0].text for ch in client(mlx_served).completions.create(stream=True, **kw)
        )

    with concurrent.futures.ThreadPoolExecutor(4) as ex:
        assert list(ex.map(one, range(4))) == [solo] * 4


def test_context_overflow_and_no_embeddings(mlx_served: Served) -> None:
    c = client(mlx_served)
    with pytest.raises(openai.BadRequestError) as ei:
        c.completions.create(
            model=mlx_served.model_id, prompt="the sea is blue " * 400, max_tokens=2
        )
    assert ei.value.body["code"] == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as ei:
        c.embeddings.create(model=mlx_served.model_id, input="hello")
    assert ei.value.body["param"] == "model"


async def test_cancel_stops_generation(tmp_path: Path, tiny_mlx: Path) -> None:
    import asyncio

    from app.core.library.index import ModelLibrary
    from app.core.service import assemble
    from app.core.types import LoadOptions, SamplingParams
    from app.runtimes.mlx.runtime import MlxRuntime

    lib = ModelLibrary(tmp_path / "lib.json", tmp_path / "models")
    m, _ = lib.import_path(tiny_mlx)
    h = assemble(lib, {"mlx": MlxRuntime()}, load_defaults=lambda: LoadOptions(context_length=1024))
    try:
        gen = await complete(
            h, m.id, "the", sampling=SamplingParams(temperature=1.0, seed=1), max_tokens=900
        )
        n = 0
        async for d in gen:
            n += d.token_count
            if n >= 5:
                gen.cancel()
                break
        lm = await h.models._scheduler.get(m.id)
        for _ in range(100):
            if lm.pending == 0:
                break
            await asyncio.sleep(0.02)
        assert lm.pending == 0, "the cancelled generation kept the model busy"
        # the grammar side of the tokenizer is prepared after the load, off the server's loop
        for _ in range(250):
            if lm.engine.guide._tokenizer is not None:  # type: ignore[attr-defined]
                break
            await asyncio.sleep(0.02)
        assert lm.engine.guide._tokenizer is not None  # type: ignore[attr-defined]
        gen2 = await complete(h, m.id, "the", sampling=SamplingParams(temperature=0), max_tokens=3)
        _c = await gen2.collect()
        _, final = _c.text, _c.final
        assert final.finish_reason == "length" and final.usage.completion_tokens == 3
    finally:
        await h.close()


# -- structured output and forced tool calls: a random tiny model, so every valid answer is the
# -- grammar's doing (unconstrained, it writes byte soup)

ANSWER_SCHEMA = {
    "type": "object",
    "properties": {
        "ok": {"type": "boolean"},
        "color": {"enum": ["red", "green", "blue"]},
        "count": {"type": "integer", "minimum": 0, "maximum": 99},
    },
    "required": ["ok", "color", "count"],
    "additionalProperties": False,
}


def test_json_schema_is_enforced_on_mlx(mlx_served: Served, tiny_mlx: Path) -> None:
    from pydantic import BaseModel

    c = client(mlx_served)
    msgs = [{"role": "user", "content": "describe the sky"}]
    free = (
        c.chat.completions.create(
            model=mlx_served.model_id, messages=msgs, max_tokens=40, temperature=0
        )
        .choices[0]
        .message.content
    )
    with pytest.raises(ValueError):
        json.loads(free)  # without the grammar the tiny model writes no JSON
    for seed in (1, 2, 3):
        r = c.chat.completions.create(
            model=mlx_served.model_id,
            messages=msgs,
            max_tokens=200,
            temperature=1.0,
            seed=seed,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "answer", "schema": ANSWER_SCHEMA, "strict": True},
            },
        )
        obj = json.loads(r.choices[0].message.content)
        assert set(obj) == {"ok", "color", "count"}
        assert isinstance(obj["ok"], bool) and obj["color"] in ("red", "green", "blue")
        assert isinstance(obj["count"], int) and 0 <= obj["count"] <= 99
        assert r.choices[0].finish_reason == "stop", "the model stops when the value is complete"

    # streamed, and json_object: a random model rarely closes a free string, so the bias makes
    # quotes and braces likely; the grammar still decides which of them may come
    vocab = json.loads((tiny_mlx / "tokenizer.json").read_text())["model"]["vocab"]
    bias = {str(vocab['"']): 6, str(vocab["}"]): 4}
    for seed in (5, 6):
        chunks = list(
            c.chat.completions.create(
                model=mlx_served.model_id,
                messages=msgs,
                max_tokens=300,
                temperature=0.7,
                seed=seed,
                stream=True,
                logit_bias=bias,
                response_format={"type": "json_object"},
            )
        )
        text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        assert isinstance(json.loads(text), dict), text
        assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "stop"

    class Answer(BaseModel):
        ok: bool
        color: str

    parsed = (
        c.beta.chat.completions.parse(
            model=mlx_served.model_id,
            messages=msgs,
            max_tokens=200,
            temperature=0.5,
            seed=9,
            response_format=Answer,
        )
        .choices[0]
        .message.parsed
    )
    assert isinstance(parsed, Answer)


def test_top_logprobs_under_a_grammar_are_valid_json(mlx_served: Served) -> None:
    """Tokens the grammar forbids are at -inf: they are listed at -9999.0 (OpenAI's value for
    "very unlikely"), never as -Infinity, which is no JSON."""
    raw = client(mlx_served).chat.completions.with_raw_response.create(
        model=mlx_served.model_id,
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=8,
        temperature=0,
        logprobs=True,
        top_logprobs=5,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "a", "schema": {"type": "object", "properties": {}}},
        },
    )

    def no_constants(c: str) -> None:
        raise AssertionError(f"{c} in the response")

    body = json.loads(raw.text, parse_constant=no_constants)
    tops = [
        t["logprob"] for e in body["choices"][0]["logprobs"]["content"] for t in e["top_logprobs"]
    ]
    assert -9999.0 in tops, "a forced token leaves forbidden ones in the top 5"


def test_a_schema_that_cannot_compile_is_a_400_on_mlx(mlx_served: Served) -> None:
    c = client(mlx_served)
    with pytest.raises(openai.BadRequestError) as ei:
        c.chat.completions.create(
            model=mlx_served.model_id,
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=5,
            response_format={
                "type": "json_schema",
                "json_schema": {
                    "name": "x",
                    "schema": {"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}},
                },
            },
        )
    assert ei.value.body["param"] == "response_format"
    # the model still answers
    r = c.chat.completions.create(
        model=mlx_served.model_id, messages=[{"role": "user", "content": "hi"}], max_tokens=3
    )
    assert r.usage.completion_tokens == 3


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 12},
                "unit": {"enum": ["c", "f"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
CLOCK = {
    "type": "function",
    "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}},
}


@pytest.mark.parametrize("stream", [False, True])
def test_forced_tool_calls_are_valid_on_mlx(
    mlx_served: Served, tiny_mlx: Path, stream: bool
) -> None:
    c = client(mlx_served)
    # the grammar allows line breaks and indents between JSON tokens (bounded); a random model
    # loves them, so they are made unlikely (a bias, not a ban: where the grammar needs one, it
    # is still the only choice)
    vocab = json.loads((tiny_mlx / "tokenizer.json").read_text())["model"]["vocab"]
    bias = {str(vocab[ws]): -100 for ws in ("\u010a", "\u0109", "\u010d")}  # \n \t \r
    msgs = [{"role": "user", "content": "weather in Paris?"}]
    named = {"type": "function", "function": {"name": "get_weather"}}
    for choice, seed in (("required", 1), (named, 2), ("required", 3)):
        kw = dict(
            model=mlx_served.model_id,
            messages=msgs,
            tools=[WEATHER, CLOCK],
            tool_choice=choice,
            parallel_tool_calls=False,
            max_tokens=120,
            temperature=1.0,
            seed=seed,
            logit_bias=bias,
        )
        if not stream:
            r = c.chat.completions.create(**kw)
            calls = [
                (t.function.name, t.function.arguments) for t in r.choices[0].message.tool_calls
            ]
            reason = r.choices[0].finish_reason
        else:
            names: dict[int, str] = {}
            args: dict[int, str] = {}
            reason = None
            for ch in c.chat.completions.create(stream=True, **kw):
                if not ch.choices:
                    continue
                for t in ch.choices[0].delta.tool_calls or []:
                    if t.function and t.function.name:
                        names[t.index] = t.function.name
                    if t.function and t.function.arguments:
                        args[t.index] = args.get(t.index, "") + t.function.arguments
                reason = ch.choices[0].finish_reason or reason
            calls = [(names[i], args.get(i, "")) for i in sorted(names)]
        assert reason == "tool_calls" and len(calls) == 1, calls
        name, arguments = calls[0]
        a = json.loads(arguments)
        if name == "get_weather":
            assert set(a) == {"city", "unit"} and a["unit"] in ("c", "f")
            assert isinstance(a["city"], str) and len(a["city"]) <= 12
        else:
            assert choice == "required" and name == "get_time" and a == {}


async def test_prompt_cache_reuses_whole_chunks_and_changes_no_bit(
    tmp_path: Path, tiny_mlx: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A conversation's later turns reuse the earlier prompt's prefill chunks; every logprob is
    the same as without the cache (penalties included: they still see the cached history)."""
    from app.core.library.index import ModelLibrary
    from app.core.service import assemble
    from app.core.types import ChatMessage, LoadOptions, SamplingParams
    from app.runtimes.mlx.runtime import PREFILL_STEP, MlxRuntime

    sampling = SamplingParams(temperature=0, repeat_penalty=1.3)
    results = {}
    for cache in ("off", "exact", "reuse"):
        lib = ModelLibrary(tmp_path / cache / "lib.json", tmp_path / cache / "models")
        m, _ = lib.import_path(tiny_mlx)
        opts = LoadOptions(prompt_cache=cache)
        h = assemble(lib, {"mlx": MlxRuntime()}, load_defaults=lambda opts=opts: opts)
        conv = [ChatMessage("user", "the sea is blue and the sky is grey " * 38)]
        turns = []
        try:
            if cache != "off":  # a prompt cancelled during prefill leaves nothing half-made
                gen = await chat(h, m.id, conv, sampling=sampling, max_tokens=3)
                gen.cancel()
                await gen.collect()
            for turn in range(3):
                gen = await chat(h, m.id, conv, sampling=sampling, max_tokens=12, logprobs=2)
                text, lps, final = await transcript(gen)
                turns.append((text, lps, final.usage.prompt_tokens, final.usage.cached_tokens))
                conv += [
                    ChatMessage("assistant", text),
                    ChatMessage("user", f"a cat sits {turn} " * 10),
                ]
            # token prompts that go just past a chunk: fewer new tokens than the penalties'
            # window, so the cached history must be shown to them
            ids = [5 + (i * 7) % 300 for i in range(PREFILL_STEP + 40)]
            for prompt in (ids, ids[: PREFILL_STEP + 20] + [9, 8, 7]):
                gen = await complete(h, m.id, prompt, sampling=sampling, max_tokens=12, logprobs=2)
                text, lps, final = await transcript(gen)
                turns.append((text, lps, final.usage.prompt_tokens, final.usage.cached_tokens))
        finally:
            await h.close()
        results[cache] = turns
    plain, cached, reused = results["off"], results["exact"], results["reuse"]
    # reuse: each turn continues from (at least) the last one's whole prompt, not only whole
    # chunks (this random model's answers tokenize differently when the template writes them
    # back, so its answer is not reused; the llama.cpp test shows answers reused)
    for turn in (1, 2):
        assert reused[turn][3] >= reused[turn - 1][2] > cached[turn][3]
    assert reused[4][3] == PREFILL_STEP + 20, "the whole common prefix of the token prompts"
    assert plain[0][2] > PREFILL_STEP + 1, "the first prompt spans a whole prefill chunk"
    assert [c for *_, c in plain] == [0] * 5
    assert cached[0][3] == 0 and cached[1][3] >= PREFILL_STEP and cached[2][3] >= PREFILL_STEP
    assert cached[4][3] == PREFILL_STEP
    assert all(c % PREFILL_STEP == 0 for *_, c in cached)
    for turn, (a, b) in enumerate(zip(plain, cached, strict=True)):
        assert a[0] == b[0] and a[2] == b[2], f"turn {turn}: the text changed"
        assert a[1] == b[1], f"turn {turn}: the logprobs changed by reusing the cache"


async def test_mlx_takes_the_default_parallel_and_decodes_one_at_a_time(
    tmp_path: Path, tiny_mlx: Path
) -> None:
    """The load default of four parallel requests applies to MLX models too: they load with it
    and answer concurrent requests one after the other, each whole."""
    from app.core.library.index import ModelLibrary
    from app.core.service import assemble
    from app.core.types import LoadOptions, SamplingParams
    from app.runtimes.mlx.runtime import MlxRuntime

    lib = ModelLibrary(tmp_path / "lib.json", tmp_path / "models")
    m, _ = lib.import_path(tiny_mlx)
    h = assemble(lib, {"mlx": MlxRuntime()}, load_defaults=lambda: LoadOptions(parallel=4))
    try:
        lm = await h.models.load(m.id)
        assert lm.engine.max_sequences == 1  # type: ignore[attr-defined]
        g = SamplingParams(temperature=0)
        gens = [await complete(h, m.id, f"the sea {i}", sampling=g, max_tokens=5) for i in range(3)]
        finals = [(await gen.collect()).final for gen in gens]
        assert [f.usage.completion_tokens for f in finals] == [5, 5, 5]
    finally:
        await h.close()


def test_the_grammar_warm_up_ends_before_close_returns(tmp_path: Path, tiny_mlx: Path) -> None:
    """A daemon warm-up thread still in native code at interpreter exit aborted a process
    ("terminate called without an active exception"): the thread is a normal one, and
    closing the model waits for it."""
    from app.core.library.index import ModelLibrary
    from app.core.types import LoadOptions
    from app.runtimes.mlx.runtime import MlxRuntime

    lib = ModelLibrary(tmp_path / "lib.json", tmp_path / "models")
    m, _ = lib.import_path(tiny_mlx)
    lm = MlxRuntime().load(m, LoadOptions())
    warm = lm.warm_thread
    assert warm is not None and not warm.daemon
    lm.close()
    assert not warm.is_alive()
