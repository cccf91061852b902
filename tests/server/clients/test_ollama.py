"""Ollama-shaped routes on the same port, driven by the real `ollama` Python client."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.core.library.gguf import read_header
from tests.conftest import Served, serving
from tests.support.gguf_rewrite import copy_with_template

ollama = pytest.importorskip("ollama", reason="the ollama client is part of the dev extra")
pytestmark = pytest.mark.model


THINKER = "smollm2-think"  # SmolLM2 whose template opens a <think> block (test_reasoning.py)


@pytest.fixture(scope="module")
def osrv(
    tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path, embedding_gguf: Path
) -> Iterator[Served]:
    src = tmp_path_factory.mktemp("think-src")
    template = (
        read_header(smollm2_path).chat_template
        # Qwen3-style: the block opens unless the request says enable_thinking=false
        + "{% if add_generation_prompt %}{% if enable_thinking is defined and not enable_thinking %}"
        + "<think>\n\n</think>\n\n{% else %}<think>\n{% endif %}{% endif %}"
    )
    thinker = copy_with_template(smollm2_path, src / "SmolLM2-Think.gguf", template)
    with serving(tmp_path_factory.mktemp("ollama"), smollm2_path, embedding_gguf, thinker) as s:
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
        (
            "/api/chat",
            {"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]},
        ),
        ("/api/chat", {"messages": [{"role": "user", "content": "x"}], "format": "xml"}),
        ("/api/chat", {"messages": [{"role": "user", "content": "x"}], "think": "maybe"}),
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


PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


def test_format_json_and_schema(osrv: Served) -> None:
    c = client(osrv)
    ask = [{"role": "user", "content": "Alice is 30 years old. Describe her."}]
    # Ollama's default repeat_penalty (1.1) with a grammar: this once aborted llama.cpp
    free = c.chat(
        model=osrv.model_id,
        messages=[{"role": "user", "content": "Give me a person as JSON."}],
        format="json",
        options={"temperature": 0, "num_predict": 64},
    )
    assert isinstance(json.loads(free.message.content), dict) and free.done_reason == "stop"
    opts = {"temperature": 0, "num_predict": 48}
    r = c.chat(model=osrv.model_id, messages=ask, format=PERSON, options=opts)
    person = json.loads(r.message.content)
    assert set(person) == {"name", "age"} and isinstance(person["name"], str)
    assert isinstance(person["age"], int) and r.done_reason == "stop"
    parts = list(
        c.chat(model=osrv.model_id, messages=ask, format=PERSON, options=opts, stream=True)
    )
    assert "".join(p.message.content for p in parts) == r.message.content
    g = c.generate(
        model=osrv.model_id, prompt="Alice is 30 years old.", format=PERSON, options=opts
    )
    assert set(json.loads(g.response)) == {"name", "age"}
    raw = c.generate(
        model=osrv.model_id,
        prompt="<|im_start|>user\nAlice is 30.<|im_end|>\n<|im_start|>assistant\n",
        raw=True,
        format=PERSON,
        options=opts,
    )
    assert set(json.loads(raw.response)) == {"name", "age"}


def test_schema_that_cannot_compile_is_400_in_ollama_shape(osrv: Served) -> None:
    bad = {"type": "object", "properties": {"a": {"$ref": "#/definitions/missing"}}}
    for path, body in (
        ("/api/chat", {"messages": [{"role": "user", "content": "x"}]}),
        ("/api/generate", {"prompt": "x"}),
    ):
        r = client(osrv)._client.post(
            path, json={"model": osrv.model_id, "stream": False, "format": bad, **body}
        )
        assert r.status_code == 400, r.text
        assert set(r.json()) == {"error"} and "schema" in r.json()["error"]
    with pytest.raises(ollama.ResponseError) as ei:
        client(osrv).chat(
            model=osrv.model_id, messages=[{"role": "user", "content": "x"}], format=bad
        )
    assert ei.value.status_code == 400


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
ASK = {"role": "user", "content": "What is the weather in Paris?"}
# earlier turns in Ollama's shape (object arguments, no ids): the tiny model copies the pattern
CALLED = {
    "role": "assistant",
    "content": "",
    "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}],
}
GREEDY = {"temperature": 0, "num_predict": 40, "repeat_penalty": 1.0}


def test_tools_call_whole_in_ollama_shape_stream_and_not(osrv: Served) -> None:
    c = client(osrv)
    msgs = [ASK, CALLED, ASK, CALLED, ASK]
    r = c.chat(model=osrv.model_id, messages=msgs, tools=[WEATHER], options=GREEDY)
    (call,) = r.message.tool_calls
    assert call.function.name == "get_weather" and call.function.arguments == {"city": "Paris"}
    assert r.message.content == "" and r.done and r.done_reason == "stop"
    raw = c._client.post(
        "/api/chat",
        json={
            "model": osrv.model_id,
            "messages": msgs,
            "tools": [WEATHER],
            "options": GREEDY,
            "stream": False,
        },
    ).json()
    (wire,) = raw["message"]["tool_calls"]
    assert wire["id"].startswith("call_") and wire["function"]["index"] == 0
    assert wire["function"]["arguments"] == {"city": "Paris"}  # an object, not a JSON string
    parts = list(
        c.chat(model=osrv.model_id, messages=msgs, tools=[WEATHER], options=GREEDY, stream=True)
    )
    with_calls = [p for p in parts if p.message.tool_calls]
    assert len(with_calls) == 1 and not with_calls[0].done and parts[-1].done
    assert with_calls[0].message.tool_calls == r.message.tool_calls
    assert not "".join(p.message.content for p in parts).strip()


def test_tool_history_round_trip(osrv: Served) -> None:
    c = client(osrv)
    history = [
        ASK,
        {**CALLED, "thinking": "I should look it up."},
        {"role": "tool", "tool_name": "get_weather", "content": '{"temp_c": 18, "sky": "cloudy"}'},
    ]
    r = c.chat(model=osrv.model_id, messages=history, tools=[WEATHER], options=GREEDY)
    assert r.done and (r.message.content or r.message.tool_calls)
    # without tools too (the template sees the calls as text), and with newer clients' ids
    with_ids = [
        ASK,
        {**CALLED, "tool_calls": [{"id": "call_7", **CALLED["tool_calls"][0]}]},
        {"role": "tool", "tool_call_id": "call_7", "content": "18 C"},
    ]
    r = c.chat(model=osrv.model_id, messages=with_ids, options=GREEDY)
    assert r.done and r.message.content and not r.message.tool_calls


def test_think_separates_reasoning(osrv: Served) -> None:
    c = client(osrv)
    shown = c.show(THINKER)
    assert {"completion", "tools", "thinking"} <= set(shown.capabilities)
    msgs = [{"role": "user", "content": "What is 2+2?"}]
    opts = {"temperature": 0, "num_predict": 16}
    # the model never closes the block the template opened: all it writes is thinking
    r = c.chat(model=THINKER, messages=msgs, think=True, options=opts)
    assert r.message.thinking and r.message.content == ""
    parts = list(c.chat(model=THINKER, messages=msgs, think=True, options=opts, stream=True))
    assert "".join(p.message.thinking or "" for p in parts) == r.message.thinking
    assert not "".join(p.message.content for p in parts)
    # absent: Ollama thinks by default on models that can; gpt-oss levels count as true
    for think in (None, "high"):
        same = c.chat(model=THINKER, messages=msgs, think=think, options=opts)
        assert same.message.thinking == r.message.thinking and same.message.content == ""
    # false is told to the template (enable_thinking), which then closes the block itself
    off = c.chat(model=THINKER, messages=msgs, think=False, options=opts)
    assert off.message.thinking is None and off.message.content
    assert "<think>" not in off.message.content and off.message.content != r.message.thinking
    g = c.generate(model=THINKER, prompt="What is 2+2?", think=True, options=opts)
    assert g.thinking == r.message.thinking and g.response == ""
