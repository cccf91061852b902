"""The engine harness itself: each real engine gets ready, serves chat/stream/embeddings, refuses
a wrong key, freezes under SIGSTOP and recovers on SIGCONT, and kill() leaves no process.

One engine kind at a time (module-scoped params), each started once for all its tests.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.e2e.engines import (
    Engine,
    EngineSet,
    EngineStartError,
    free_port,
    http_request,
    require_llama_server,
    sse_events,
    start_llama_cpp_python,
)
from tests.support.cross_encoder import write_cross_encoder

pytestmark = pytest.mark.model

KEY = "e2e-harness-key"
# What each engine does with stream_options.include_usage (pinned versions; see RECORDED-REAL.md)
USAGE_IN_STREAM = {"hearth": True, "llama-cpp-python": False, "llama.cpp": True}


@dataclass
class Subject:
    kind: str
    chat: Engine
    embed: Engine  # the same process as chat where the engine serves both

    @property
    def chat_id(self) -> str:
        return self.chat.models["chat"]

    @property
    def embed_id(self) -> str:
        return self.embed.models["embedding"]

    def all(self) -> list[Engine]:
        return [self.chat] if self.embed is self.chat else [self.chat, self.embed]


@pytest.fixture(scope="module", params=["hearth", "llama-cpp-python", "llama.cpp"])
def subject(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    smollm2_path: Path,
    embedding_gguf: Path,
) -> Iterator[Subject]:
    kind = request.param
    if kind == "llama.cpp":
        require_llama_server()
    es = EngineSet(tmp_path_factory.mktemp(kind))
    try:
        if kind == "hearth":
            e = es.hearth([smollm2_path, embedding_gguf], api_key=KEY)
            e.models["chat"] = e.models[smollm2_path.stem]
            e.models["embedding"] = e.models[embedding_gguf.stem]
            yield Subject(kind, e, e)
        elif kind == "llama-cpp-python":
            e = es.llama_cpp_python(smollm2_path, embedding_gguf, api_key=KEY)
            yield Subject(kind, e, e)
        else:
            chat = es.llama_server(smollm2_path, api_key=KEY)
            emb = es.llama_server(embedding_gguf, embedding=True, api_key=KEY)
            yield Subject(kind, chat, emb)
    finally:
        es.close()


def chat_body(model: str, **extra: object) -> dict[str, object]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": "Say hello."}],
        "max_tokens": 4,
        "temperature": 0,
        **extra,
    }


def test_lists_the_given_models(subject: Subject) -> None:
    for engine, mid in ((subject.chat, subject.chat_id), (subject.embed, subject.embed_id)):
        r = engine.get("/v1/models")
        assert r.status == 200, r.body
        ids = [m["id"] for m in r.body["data"]]
        assert mid in ids, (subject.kind, ids)


def test_chat_non_streaming(subject: Subject) -> None:
    r = subject.chat.post("/v1/chat/completions", chat_body(subject.chat_id))
    assert r.status == 200, r.body
    choice = r.body["choices"][0]
    assert isinstance(choice["message"]["content"], str) and choice["message"]["content"]
    assert choice["finish_reason"] in ("length", "stop")
    assert 1 <= r.body["usage"]["completion_tokens"] <= 4
    assert r.body["usage"]["prompt_tokens"] > 0


def test_chat_streaming_and_usage(subject: Subject) -> None:
    body = chat_body(subject.chat_id, stream=True, stream_options={"include_usage": True})
    r = subject.chat.post("/v1/chat/completions", body)
    assert r.status == 200, r.body
    assert r.headers["content-type"].startswith("text/event-stream")
    raw = r.raw.decode()
    assert "data: [DONE]" in raw
    events = sse_events(raw)
    text = "".join(c["delta"].get("content") or "" for e in events for c in e.get("choices", []))
    assert text
    finishes = [
        c["finish_reason"] for e in events for c in e.get("choices", []) if c.get("finish_reason")
    ]
    assert finishes and finishes[-1] in ("length", "stop")
    usage = [e["usage"] for e in events if e.get("usage")]
    assert bool(usage) is USAGE_IN_STREAM[subject.kind], (subject.kind, usage)
    if usage:
        assert 1 <= usage[-1]["completion_tokens"] <= 4


def test_embeddings(subject: Subject) -> None:
    r = subject.embed.post("/v1/embeddings", {"model": subject.embed_id, "input": ["a", "b c"]})
    assert r.status == 200, r.body
    vecs = [d["embedding"] for d in r.body["data"]]
    assert len(vecs) == 2 and len(vecs[0]) == len(vecs[1]) == 384
    assert all(isinstance(x, float) for x in vecs[0])


def test_wrong_or_missing_key_is_401(subject: Subject) -> None:
    for engine in subject.all():
        assert engine.get("/v1/models", key="not-the-key").status == 401
        r = http_request(engine.base_url + "/models")  # no Authorization at all
        assert r.status == 401, (subject.kind, r.status, r.body)
        bad = engine.post("/v1/chat/completions", chat_body(subject.chat_id), key="nope")
        assert bad.status == 401


def test_sigstop_times_out_and_sigcont_recovers(subject: Subject) -> None:
    e = subject.chat
    e.stop()
    try:
        # a stopped process accepts the connection (kernel backlog) but can never answer
        r = e.get("/v1/models", timeout=2)
        assert r.status == 0, (subject.kind, r.status)
    finally:
        e.cont()
    assert e.get("/v1/models", timeout=120).status == 200
    again = e.post("/v1/chat/completions", chat_body(subject.chat_id), timeout=120)
    assert again.status == 200, again.body


def test_kill_leaves_no_process(subject: Subject) -> None:
    # last in the module: the fixture's engines are gone after this
    for e in subject.all():
        pid = e.pid
        rc = e.kill()
        assert rc == -9 and not e.alive()
        deadline = time.monotonic() + 60
        while True:
            try:
                os.killpg(pid, 0)  # anything left in its process group?
            except ProcessLookupError:
                break
            assert time.monotonic() < deadline, f"{subject.kind}: group {pid} still has processes"
            time.sleep(0.1)
        assert e.get("/v1/models", timeout=5).status == 0


def test_engine_set_closes_what_it_started(tmp_path: Path, smollm2_path: Path) -> None:
    es = EngineSet(tmp_path)
    e = es.llama_cpp_python(smollm2_path)
    assert e.get("/v1/models").status == 200 and e.base_url.endswith("/v1")
    e.stop()  # close() must still end a stopped engine
    es.close()
    assert not e.alive()
    with pytest.raises(ProcessLookupError):
        os.killpg(e.pid, 0)


def test_a_port_lost_to_a_race_is_retried_once(tmp_path: Path, smollm2_path: Path) -> None:
    # the first port handed out is already taken (by a listener that never answers)
    squatter = socket.socket()
    squatter.bind(("127.0.0.1", 0))
    squatter.listen(8)
    taken = squatter.getsockname()[1]
    handed = iter([taken, free_port()])
    try:
        e = start_llama_cpp_python(tmp_path, smollm2_path, ports=lambda: next(handed))
    finally:
        squatter.close()
    try:
        assert e.port != taken and e.get("/v1/models").status == 200
        race_log = tmp_path / "llama-cpp-python" / "server.bind-race.log"
        assert "address already in use" in race_log.read_text().lower()
    finally:
        e.close()


def test_an_engine_that_never_gets_ready_shows_its_stderr(tmp_path: Path) -> None:
    bogus = tmp_path / "not-a-model.gguf"
    bogus.write_bytes(b"this is not a gguf file")
    with pytest.raises(EngineStartError) as info:
        start_llama_cpp_python(tmp_path, bogus)
    msg = str(info.value)
    assert "exited" in msg and "stderr:" in msg
    # llama-cpp-python's own loader complaint, read back from the captured stderr file
    assert "Failed to load model from file" in msg


def test_llama_server_rerank(tmp_path: Path, embedding_gguf: Path) -> None:
    require_llama_server()
    ce = write_cross_encoder(embedding_gguf, tmp_path / "cross-encoder.gguf")
    es = EngineSet(tmp_path)
    try:
        e = es.llama_server(ce, rerank=True, api_key=KEY)
        docs = ["a cat sat", "a car", "dogs bark"]
        body = {"model": e.models["rerank"], "query": "cats", "documents": docs}
        r = e.post("/v1/rerank", body)
        assert r.status == 200, r.body
        results = r.body["results"]
        assert sorted(x["index"] for x in results) == [0, 1, 2]
        scores = [x["relevance_score"] for x in results]
        assert scores == sorted(scores, reverse=True)  # best first
        top = e.post("/v1/rerank", {**body, "top_n": 2})
        assert top.status == 200 and len(top.body["results"]) == 2
        assert e.post("/v1/rerank", body, key="wrong").status == 401
    finally:
        es.close()
