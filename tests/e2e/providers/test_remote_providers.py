"""Remote engines as providers, end to end with real processes on loopback: a
second `hearth serve` as provider `lan` (behind an API key, kind detected as hearth) and
llama-cpp-python's own server `python -m llama_cpp.server` (kind detected as openai), behind a
front `hearth serve`; llama.cpp's `llama-server` as kind llama.cpp when it is built.

Through the front: the listings, chat and streams on all four protocols, tools and structured
output, embeddings, rerank (the engine's own on Hearth, the cosine of embeddings on
llama_cpp.server, which has none), count_tokens, usage for an engine that sends none."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.e2e.engines import Engine, EngineSet, require_llama_server
from tests.e2e.providers.providers_front import (
    call,
    cli,
    model_ids,
    stream_events,
    until,
    wait_ready,
)
from tests.e2e.serveproc import ServeProc, start_serve

LAN_KEY = "lan-engine-key-7f3a"
HI = [{"role": "user", "content": "Say hello to me."}]


@pytest.fixture(scope="module")
def lan(engines: EngineSet, smollm2_path: Path, embedding_gguf: Path) -> Engine:
    return engines.hearth([smollm2_path, embedding_gguf], api_key=LAN_KEY)


@pytest.fixture(scope="module")
def lcp(engines: EngineSet, smollm2_path: Path, embedding_gguf: Path) -> Engine:
    return engines.llama_cpp_python(smollm2_path, embedding_gguf)


@pytest.fixture(scope="module")
def front(
    tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path, lan: Engine, lcp: Engine
) -> Iterator[ServeProc]:
    home = tmp_path_factory.mktemp("front")
    # added before the server starts (no --kind: detected); `--api-key -` reads stdin
    r = cli(home, "providers", "add", "lan", lan.base_url, "--api-key", "-", stdin=LAN_KEY + "\n")
    assert r.returncode == 0, r.stderr
    r = cli(home, "providers", "add", "lcp", lcp.base_url)
    assert r.returncode == 0, r.stderr
    s = start_serve(home, smollm2_path)
    try:
        wait_ready(s, "lan", "lcp")
        yield s
    finally:
        s.stop()


def _chat_id(e: Engine) -> str:
    """The engine's chat model as the front names it."""
    prefix = "lan/" if e.kind == "hearth" else "lcp/"
    return prefix + (e.models["SmolLM2-135M-Instruct.Q4_1"] if e.kind == "hearth" else "smollm2")


def _emb_id(e: Engine) -> str:
    prefix = "lan/" if e.kind == "hearth" else "lcp/"
    return prefix + (e.models["all-minilm-l6-v2-q8_0"] if e.kind == "hearth" else "minilm")


@pytest.fixture(params=["lan", "lcp"])
def engine(request: pytest.FixtureRequest, front: ServeProc) -> Engine:
    return request.getfixturevalue(request.param)  # type: ignore[no-any-return]


def test_cli_detects_kinds_and_lists_providers(front: ServeProc, lan: Engine, lcp: Engine) -> None:
    r = cli(front.home, "providers", "ls", "--json")
    assert r.returncode == 0, r.stderr
    got = {p["name"]: p for p in json.loads(r.stdout)}
    assert set(got["lan"]) == {
        "name", "url", "kind", "prefix", "state", "models", "latency_ms", "error"
    }  # fmt: skip
    assert (got["lan"]["kind"], got["lcp"]["kind"]) == ("hearth", "openai")
    assert got["lan"]["state"] == got["lcp"]["state"] == "ready"
    assert _chat_id(lan) in got["lan"]["models"] and _emb_id(lan) in got["lan"]["models"]
    assert got["lcp"]["models"] == ["lcp/smollm2", "lcp/minilm"]
    assert got["lan"]["prefix"] == "lan/" and isinstance(got["lan"]["latency_ms"], float)
    t = cli(front.home, "providers", "test", "lan")
    assert t.returncode == 0, t.stdout + t.stderr
    assert [line.split("\t")[1] for line in t.stdout.splitlines()] == ["health", "models", "chat"]


def test_remote_models_are_listed_by_their_provider(front: ServeProc, lan: Engine) -> None:
    data = {m["id"]: m for m in call(front, "GET", "/v1/models").body["data"]}
    m = data[_chat_id(lan)]
    assert (m["owned_by"], m["state"]) == ("lan", "remote")
    assert isinstance(m["context_length"], int) and "chat" in m["capabilities"]
    assert data[_emb_id(lan)]["capabilities"] == ["embeddings", "rerank"]
    assert data["lcp/smollm2"]["owned_by"] == "lcp"
    one = call(front, "GET", "/v1/models/" + _chat_id(lan))
    assert one.status == 200 and one.body["owned_by"] == "lan"
    tags = {t["name"]: t for t in call(front, "GET", "/api/tags").body["models"]}
    assert tags[_chat_id(lan) + ":latest"]["owned_by"] == "lan"
    health = call(front, "GET", "/health").body
    assert {"name": "lan", "state": "ready"} in health["providers"]


def _openai_stream(front: ServeProc, model: str) -> dict[str, Any]:
    body = {"model": model, "messages": HI, "max_tokens": 6, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    r = call(front, "POST", "/v1/chat/completions", body)
    assert r.status == 200, r.body
    events, done = stream_events(r.raw)
    assert done and all(e["model"] == model for e in events)
    text = "".join(c["delta"].get("content") or "" for e in events for c in e["choices"])
    usage = [e["usage"] for e in events if e.get("usage")]
    assert text and len(usage) == 1, r.raw[-600:]
    return usage[0]  # type: ignore[no-any-return]


def test_chat_streams_on_openai_with_usage(front: ServeProc, engine: Engine) -> None:
    """llama_cpp.server sends no usage in streams (recorded): the client still gets one."""
    usage = _openai_stream(front, _chat_id(engine))
    assert usage["completion_tokens"] >= 1
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


@pytest.mark.parametrize("protocol", ["openai", "responses", "anthropic", "anthropic-stream",
                                      "ollama", "ollama-stream", "completions"])  # fmt: skip
def test_every_protocol_reaches_the_remote_model(
    front: ServeProc, engine: Engine, protocol: str
) -> None:
    model = _chat_id(engine)
    if protocol == "openai":
        r = call(
            front, "POST", "/v1/chat/completions", {"model": model, "messages": HI, "max_tokens": 6}
        )
        assert r.status == 200, r.body
        assert r.body["model"] == model and r.body["choices"][0]["message"]["content"]
        assert r.headers["x-hearth-route"] == model
    elif protocol == "completions":
        r = call(
            front,
            "POST",
            "/v1/completions",
            {"model": model, "prompt": "Once upon a", "max_tokens": 5},
        )
        assert r.status == 200, r.body
        assert r.body["choices"][0]["text"] and r.body["usage"]["completion_tokens"] >= 1
    elif protocol == "responses":
        body = {"model": model, "input": "Say hi", "max_output_tokens": 16, "stream": True}
        r = call(front, "POST", "/v1/responses", body)
        assert r.status == 200, r.body
        events, _ = stream_events(r.raw)
        ends = ("response.completed", "response.incomplete")  # incomplete: max_output_tokens
        done = [e for e in events if e.get("type") in ends]
        assert done and done[0]["response"]["model"] == model
    elif protocol.startswith("anthropic"):
        stream = protocol.endswith("stream")
        body = {"model": model, "max_tokens": 6, "messages": HI, "stream": stream}
        r = call(front, "POST", "/v1/messages", body)
        assert r.status == 200, r.body
        if stream:
            events, _ = stream_events(r.raw)
            kinds = [e["type"] for e in events]
            assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
            assert any(e["type"] == "content_block_delta" for e in events)
        else:
            assert r.body["model"] == model and r.body["content"][0]["text"]
            assert r.body["usage"]["output_tokens"] >= 1
    else:
        stream = protocol.endswith("stream")
        body = {"model": model, "messages": HI, "stream": stream, "options": {"num_predict": 6}}
        r = call(front, "POST", "/api/chat", body)
        assert r.status == 200, r.body
        lines = [json.loads(x) for x in r.raw.decode().splitlines() if x.strip()]
        assert lines[-1]["done"] is True and lines[-1]["model"] == model
        assert "".join(x["message"]["content"] for x in lines)


def test_structured_output_through_the_front(front: ServeProc, engine: Engine) -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    body = {
        "model": _chat_id(engine),
        "messages": [{"role": "user", "content": "Give me a number as JSON."}],
        "max_tokens": 40,
        "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": schema}},
    }
    r = call(front, "POST", "/v1/chat/completions", body)
    assert r.status == 200, r.body
    out = json.loads(r.body["choices"][0]["message"]["content"])
    assert isinstance(out["n"], int)


def test_tools_through_the_front(front: ServeProc, lan: Engine) -> None:
    """A forced tool call on the remote Hearth, as an OpenAI and an Anthropic client see it."""
    city = {"type": "string", "enum": ["Oslo", "Paris"]}  # a bounded call: it always ends
    params = {"type": "object", "properties": {"city": city}, "required": ["city"]}
    tool = {"type": "function",
            "function": {"name": "get_weather", "description": "weather", "parameters": params}}  # fmt: skip
    body = {"model": _chat_id(lan), "messages": [{"role": "user", "content": "Weather in Oslo?"}],
            "tools": [tool], "tool_choice": "required", "parallel_tool_calls": False,
            "max_tokens": 200}  # fmt: skip
    r = call(front, "POST", "/v1/chat/completions", body)
    assert r.status == 200, r.body
    choice = r.body["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    call0 = choice["message"]["tool_calls"][0]
    assert call0["function"]["name"] == "get_weather"
    assert "city" in json.loads(call0["function"]["arguments"])
    a = call(front, "POST", "/v1/messages", {
        "model": _chat_id(lan), "max_tokens": 200,
        "messages": [{"role": "user", "content": "Weather in Oslo?"}],
        "tools": [{"name": "get_weather", "description": "weather",
                   "input_schema": params}],
        "tool_choice": {"type": "tool", "name": "get_weather"},
    })  # fmt: skip
    assert a.status == 200, a.body
    uses = [b for b in a.body["content"] if b["type"] == "tool_use"]
    assert a.body["stop_reason"] == "tool_use" and uses[0]["name"] == "get_weather"
    assert isinstance(uses[0]["input"], dict)


def test_embeddings_and_rerank_through_the_front(front: ServeProc, engine: Engine) -> None:
    emb = _emb_id(engine)
    r = call(front, "POST", "/v1/embeddings", {"model": emb, "input": ["a cat", "a dog"]})
    assert r.status == 200, r.body
    assert [len(d["embedding"]) for d in r.body["data"]] == [384, 384]
    o = call(front, "POST", "/api/embed", {"model": emb, "input": ["a cat"]})
    assert o.status == 200 and len(o.body["embeddings"][0]) == 384
    docs = ["Quarterly revenue rose by four percent.", "A kitten is sitting on a rug."]
    rr = call(front, "POST", "/v1/rerank", {"model": emb, "query": "A cat sits on the mat.",
                                            "documents": docs, "return_documents": True})  # fmt: skip
    assert rr.status == 200, rr.body
    assert rr.body["results"][0]["index"] == 1  # the paraphrase above the unrelated text
    assert rr.body["results"][0]["document"]["text"] == docs[1]


def test_count_tokens_where_the_engine_counts(front: ServeProc, lan: Engine) -> None:
    body = {"model": _chat_id(lan), "messages": HI}
    r = call(front, "POST", "/v1/messages/count_tokens", body)
    assert r.status == 200 and r.body["input_tokens"] > 5, r.body
    # llama_cpp.server has no endpoint that renders a chat: said plainly
    r = call(front, "POST", "/v1/messages/count_tokens", {**body, "model": "lcp/smollm2"})
    assert r.status == 400 and "count tokens" in r.body["error"]["message"], r.body


def test_a_remote_id_the_engine_does_not_list_is_a_404(front: ServeProc) -> None:
    # llama_cpp.server would silently answer an unknown id with its first model (recorded):
    # the front checks the engine's list first
    r = call(front, "POST", "/v1/chat/completions", {"model": "lcp/SmolLM2", "messages": HI})
    assert r.status == 404 and r.body["error"]["code"] == "model_not_found", r.body


def test_cli_changes_reach_the_running_server(front: ServeProc, lan: Engine) -> None:
    r = cli(front.home, "providers", "add", "late", lan.base_url, "--kind", "hearth",
            "--api-key", LAN_KEY)  # fmt: skip
    assert r.returncode == 0, r.stderr
    late = "late/" + _chat_id(lan).removeprefix("lan/")
    until("late's models listed", lambda: late in model_ids(front))
    clash = cli(front.home, "providers", "add", "dup", lan.base_url, "--prefix", "late/")
    assert clash.returncode == 1 and "clashes with provider 'late'" in clash.stderr
    assert cli(front.home, "providers", "rm", "late").returncode == 0
    until("late's models gone", lambda: late not in model_ids(front))
    assert cli(front.home, "providers", "rm", "late").returncode == 1


@pytest.fixture(scope="module")
def llama_server(engines: EngineSet, smollm2_path: Path) -> Engine:
    require_llama_server()
    return engines.llama_server(smollm2_path)


def test_llama_server_as_a_llama_cpp_provider(front: ServeProc, llama_server: Engine) -> None:
    r = cli(front.home, "providers", "add", "lcs", llama_server.base_url)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\t")[1] == "llama.cpp"  # detected
    until("lcs listed", lambda: "lcs/smollm2" in model_ids(front))
    m = next(x for x in call(front, "GET", "/v1/models").body["data"] if x["id"] == "lcs/smollm2")
    assert m["context_length"] == 1024  # its n_ctx (-c 1024), not n_ctx_train
    usage = _openai_stream(front, "lcs/smollm2")
    assert usage["prompt_tokens"] > 0  # llama-server's own usage chunk
    a = call(
        front, "POST", "/v1/messages", {"model": "lcs/smollm2", "max_tokens": 5, "messages": HI}
    )
    assert a.status == 200 and a.body["content"][0]["text"], a.body
    n = call(front, "POST", "/v1/messages/count_tokens", {"model": "lcs/smollm2", "messages": HI})
    assert n.status == 200 and n.body["input_tokens"] > 5, n.body  # /apply-template + /tokenize
    assert cli(front.home, "providers", "rm", "lcs").returncode == 0


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages", "/api/chat"])
def test_an_upstream_400_is_translated_and_not_retried(front: ServeProc, path: str) -> None:
    """llama_cpp.server refuses a prompt over its 1,024-token context with a 400: each
    protocol gets it in its own error shape, the provider named, and the chain's local
    target is not tried (a 400 would fail anywhere)."""
    r = cli(
        front.home,
        "alias",
        "set",
        "lcp-chain",
        "lcp/smollm2",
        front.models["SmolLM2-135M-Instruct.Q4_1"],
    )
    assert r.returncode == 0, r.stderr
    long = [{"role": "user", "content": "hello there " * 1500}]
    body: dict[str, Any] = {"model": "lcp-chain", "messages": long, "max_tokens": 4}
    if path == "/api/chat":
        body = {"model": "lcp-chain", "messages": long, "stream": False}
    out = call(front, "POST", path, body)
    assert out.status == 400, out.body
    assert out.headers["x-hearth-route"] == "lcp/smollm2"
    if path == "/api/chat":
        message = out.body["error"]
    else:
        message = out.body["error"]["message"]
        want = "invalid_request_error"
        assert out.body["error"]["type"] == want
    assert "provider 'lcp' answered 400" in message and "context" in message


def test_the_names_api_tags_lists_come_back_on_ollama_routes(front: ServeProc, lan: Engine) -> None:
    """Ollama clients send back the name /api/tags gave them (`lan/ID:latest`)."""
    tags = [t["name"] for t in call(front, "GET", "/api/tags").body["models"]]
    name = _chat_id(lan) + ":latest"
    assert name in tags
    r = call(front, "POST", "/api/chat", {"model": name, "messages": HI, "stream": False,
                                          "options": {"num_predict": 3}})  # fmt: skip
    assert r.status == 200 and r.body["message"]["content"], r.body
    shown = call(front, "POST", "/api/show", {"model": name})
    assert shown.status == 200 and shown.body["owned_by"] == "lan", shown.body


def test_changing_a_provider_does_not_cut_its_running_streams(
    front: ServeProc, lan: Engine
) -> None:
    """A provider re-added (another timeout) while a stream runs on it: the stream finishes
    ([DONE]); the next request goes through the new client."""
    schema = {"type": "object", "properties": {"s": {"type": "string", "minLength": 300}},
              "required": ["s"]}  # fmt: skip
    # 300 tokens: ~15 s of stream on 2 cores, against ~1-2 s for the CLI's re-add
    body = {"model": _chat_id(lan), "messages": HI, "max_tokens": 300, "stream": True,
            "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}}  # fmt: skip
    u = urlsplit(front.root)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=300)
    try:
        conn.request(
            "POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"}
        )
        resp = conn.getresponse()
        assert resp.status == 200
        head = b""
        while b'"content"' not in head:
            head += resp.read1(65536)
        r = cli(front.home, "providers", "add", "lan", lan.base_url, "--kind", "hearth",
                "--api-key", "-", "--first-token-timeout", "100", stdin=LAN_KEY + "\n")  # fmt: skip
        assert r.returncode == 0, r.stderr
        rest = b""
        while chunk := resp.read1(65536):
            rest += chunk
    finally:
        conn.close()
    events, done = stream_events(head + rest)
    assert done and not [e for e in events if "error" in e], (head + rest)[-500:]
    wait_ready(front, "lan")
    again = call(
        front,
        "POST",
        "/v1/chat/completions",
        {"model": _chat_id(lan), "messages": HI, "max_tokens": 3},
    )
    assert again.status == 200, again.body


def test_providers_are_probed_when_the_server_starts(
    tmp_path: Path, smollm2_path: Path, lan: Engine
) -> None:
    """No request needed: the log says the provider is ready (nothing asked the server)."""
    home = tmp_path / "starts"
    r = cli(home, "providers", "add", "lan", lan.base_url, "--kind", "hearth", "--api-key", LAN_KEY)
    assert r.returncode == 0, r.stderr
    s = start_serve(home, verbose=1)
    try:
        until(
            "the start probe",
            lambda: "provider lan: ready" in (s.home / "serve.stderr").read_text(),
        )
    finally:
        s.stop()


def test_a_scoped_key_cannot_count_tokens_on_a_provider_model_outside_its_scope(
    front: ServeProc, lan: Engine
) -> None:
    """count_tokens resolves a provider's model through the one access check chat uses: a key
    limited to the local model gets, for the provider's model, the 404 an unknown name gets."""
    local = front.models["SmolLM2-135M-Instruct.Q4_1"]
    scoped = cli(front.home, "keys", "add", "only-local", "--models", local)
    admin = cli(front.home, "keys", "add", "boss", "--admin")
    assert scoped.returncode == 0 and admin.returncode == 0, scoped.stderr + admin.stderr
    try:
        body = {"model": _chat_id(lan), "max_tokens": 1, "messages": HI}
        path = "/v1/messages/count_tokens"

        def count(model: str, key: str) -> Any:
            return call(front, "POST", path, {**body, "model": model},
                        headers={"x-api-key": key.strip()})  # fmt: skip

        out = count(_chat_id(lan), scoped.stdout)
        unknown = count("lan/no-such-model", scoped.stdout)
        assert out.status == unknown.status == 404, (out.body, unknown.body)
        assert out.body["error"]["type"] == unknown.body["error"]["type"]
        masked = out.body["error"]["message"].replace(_chat_id(lan), "X")
        assert masked == unknown.body["error"]["message"].replace("lan/no-such-model", "X")
        # the same key counts on its own model, and an admin key on the provider's
        assert count(local, scoped.stdout).status == 200
        ok = count(_chat_id(lan), admin.stdout)
        assert ok.status == 200 and ok.body["input_tokens"] > 0, ok.body
    finally:
        for name in ("only-local", "boss"):
            cli(front.home, "keys", "rm", name)
