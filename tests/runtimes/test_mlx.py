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

from tests.conftest import Served, serving

pytest.importorskip("mlx_lm", reason="MLX runtime tests need mlx-lm (and mlx[cpu] on Linux)")


@pytest.fixture(scope="module")
def tiny_mlx(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.mlx_model import build_tiny_mlx_model

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

    from app.core.library import ModelLibrary
    from app.core.service import Hearth
    from app.core.types import LoadOptions, SamplingParams
    from app.runtimes.mlx import MlxRuntime

    lib = ModelLibrary(tmp_path / "lib.json", tmp_path / "models")
    m, _ = lib.import_path(tiny_mlx)
    h = Hearth(lib, {"mlx": MlxRuntime()}, load_defaults=lambda: LoadOptions(context_length=1024))
    try:
        gen = await h.complete(
            m.id, "the", sampling=SamplingParams(temperature=1.0, seed=1), max_tokens=900
        )
        n = 0
        async for d in gen:
            n += d.token_count
            if n >= 5:
                gen.cancel()
                break
        lm = await h.scheduler.get(m.id)
        for _ in range(100):
            if lm.pending == 0:
                break
            await asyncio.sleep(0.02)
        assert lm.pending == 0, "the cancelled generation kept the model busy"
        gen2 = await h.complete(m.id, "the", sampling=SamplingParams(temperature=0), max_tokens=3)
        _, final = await gen2.collect()
        assert final.finish_reason == "length" and final.usage.completion_tokens == 3
    finally:
        await h.close()
