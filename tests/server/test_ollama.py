"""Ollama-shaped routes on the same port, driven by the real `ollama` Python client."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Served, serving

ollama = pytest.importorskip("ollama", reason="the ollama client is part of the dev extra")
pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def osrv(
    tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path, embedding_gguf: Path
) -> Iterator[Served]:
    with serving(tmp_path_factory.mktemp("ollama"), smollm2_path, embedding_gguf) as s:
        yield s


def client(s: Served) -> ollama.Client:
    return ollama.Client(host=s.root, timeout=120)


def test_version_tags_show(osrv: Served) -> None:
    c = client(osrv)
    assert c._client.get("/api/version").json()["version"]
    tags = c.list()
    names = [m.model for m in tags.models]
    assert f"{osrv.model_id}:latest" in names
    m = next(m for m in tags.models if m.model == f"{osrv.model_id}:latest")
    assert m.details.family == "llama" and m.details.quantization_level == "Q4_1" and m.size > 0
    shown = c.show(f"{osrv.model_id}:latest")
    assert "im_start" in shown.template and "completion" in shown.capabilities
    assert shown.modelinfo["llama.context_length"] == 8192
    with pytest.raises(ollama.ResponseError) as ei:
        c.show("no-such-model")
    assert ei.value.status_code == 404 and "does not exist" in ei.value.error


def test_chat_stream_and_not(osrv: Served) -> None:
    c = client(osrv)
    msgs = [{"role": "user", "content": "Say hello."}]
    opts = {"temperature": 0, "num_predict": 12}
    whole = c.chat(model=osrv.model_id, messages=msgs, options=opts)
    assert whole.message.role == "assistant" and whole.message.content
    assert whole.done and whole.done_reason in ("stop", "length") and whole.eval_count <= 12
    assert whole.prompt_eval_count > 0 and whole.total_duration > 0
    parts = list(c.chat(model=f"{osrv.model_id}:latest", messages=msgs, options=opts, stream=True))
    assert len(parts) > 2 and parts[-1].done and not any(p.done for p in parts[:-1])
    assert "".join(p.message.content for p in parts) == whole.message.content


def test_generate_raw_and_templated(osrv: Served) -> None:
    c = client(osrv)
    r = c.generate(
        model=osrv.model_id,
        prompt="The capital of France is",
        raw=True,
        options={"temperature": 0, "num_predict": 5},
    )
    assert r.response and r.done and r.eval_count == 5 and r.done_reason == "length"
    t = c.generate(
        model=osrv.model_id,
        prompt="Hi!",
        system="Answer in one word.",
        options={"temperature": 0, "num_predict": 8},
    )
    assert t.done
    stream = list(
        c.generate(
            model=osrv.model_id,
            prompt="One, two,",
            raw=True,
            stream=True,
            options={"temperature": 0, "num_predict": 4, "stop": ["\n"]},
        )
    )
    assert stream[-1].done


def test_embed_and_ps_and_keep_alive_unload(osrv: Served) -> None:
    c = client(osrv)
    emb = c.embed(
        model="all-minilm-l6-v2-q8_0", input=["a cat sits on the mat", "a kitten rests on a rug"]
    )
    a, b = emb.embeddings
    assert len(a) == 384 and sum(x * y for x, y in zip(a, b, strict=True)) == pytest.approx(
        0.66, abs=0.05
    )
    legacy = c._client.post(
        "/api/embeddings", json={"model": "all-minilm-l6-v2-q8_0", "prompt": "hello"}
    ).json()
    assert len(legacy["embedding"]) == 384
    ps = c.ps()
    assert {m.model for m in ps.models} >= {"all-minilm-l6-v2-q8_0:latest"}
    # Ollama's idiom: an empty generate with keep_alive 0 unloads the model
    r = c._client.post(
        "/api/generate", json={"model": "all-minilm-l6-v2-q8_0", "keep_alive": 0}
    ).json()
    assert r["done_reason"] == "unload"
    assert "all-minilm-l6-v2-q8_0:latest" not in {m.model for m in c.ps().models}
    r = c._client.post("/api/generate", json={"model": osrv.model_id, "keep_alive": "5m"}).json()
    assert r["done_reason"] == "load"
    loaded = {m.model: m for m in c.ps().models}
    assert f"{osrv.model_id}:latest" in loaded


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/api/chat", {"messages": [{"role": "user", "content": "x"}], "format": "json"}),
        (
            "/api/chat",
            {"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]},
        ),
        ("/api/chat", {"messages": [{"role": "user", "content": "x", "images": ["aGk="]}]}),
        ("/api/generate", {"prompt": "x", "suffix": "y"}),
        (
            "/api/chat",
            {"messages": [{"role": "user", "content": "x"}], "options": {"temperature": 9}},
        ),
    ],
)
def test_unsupported_or_bad_fields_are_400_in_ollama_shape(
    osrv: Served, path: str, body: dict
) -> None:
    r = client(osrv)._client.post(path, json={"model": osrv.model_id, "stream": False, **body})
    assert r.status_code == 400
    err = r.json()
    assert set(err) == {"error"} and isinstance(err["error"], str)


def test_errors_stay_openai_shaped_elsewhere(osrv: Served) -> None:
    r = client(osrv)._client.post("/v1/chat/completions", json={"model": "nope", "messages": []})
    assert "error" in r.json() and isinstance(r.json()["error"], dict)
    r = client(osrv)._client.post("/api/chat", content=b"{not json")
    assert r.status_code == 400 and isinstance(r.json()["error"], str)
    assert json.loads(client(osrv)._client.get("/api/v1/ps").text)["models"] is not None
