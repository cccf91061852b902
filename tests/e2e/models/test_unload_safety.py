"""Unloading a model while requests use it never crashes the server (item 2).

Each native call (tokenize, pieces, grammar checks, embeddings, generation) is finished or
refused before the model's memory is freed. These run against a real `hearth serve` child so
that a segfault or abort shows as a failed test instead of killing pytest; on the code before
the fix the first test died with SIGSEGV and the embeddings one with SIGABRT.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.serveproc import ServeProc, start_serve

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path, embedding_gguf: Path
) -> Any:
    s = start_serve(tmp_path_factory.mktemp("unload"), smollm2_path, embedding_gguf)
    yield s
    s.stop()


def _ids(s: ServeProc) -> tuple[str, str]:
    chat = next(v for k, v in s.models.items() if "SmolLM2" in k)
    emb = next(v for k, v in s.models.items() if "minilm" in k.lower())
    return chat, emb


def _in_background(fn: Any) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}
    t = threading.Thread(target=lambda: out.setdefault("r", fn()), daemon=True)
    t.start()
    return t, out


def _assert_alive(s: ServeProc) -> None:
    assert s.alive(), f"hearth serve died (rc {s.proc.returncode}):\n{s.stderr_tail()}"
    s.health_seconds()


@pytest.mark.parametrize("with_pieces", [False, True])
def test_unload_while_a_long_tokenize_runs(server: ServeProc, with_pieces: bool) -> None:
    chat, _ = _ids(server)
    # seconds of tokenizer time (3.8 MB); with pieces, within their bound (~256k tokens)
    text = "hello world, this is some text. " * (32_000 if with_pieces else 120_000)
    for delay in (0.0, 0.05, 0.3):
        assert server.post("/api/v1/models/load", {"model": chat})[0] == 200
        t, out = _in_background(
            lambda: server.post(
                "/tokenize", {"model": chat, "content": text, "with_pieces": with_pieces}
            )
        )
        time.sleep(delay)  # varies where the unload lands; any order must be safe
        st, body = server.post("/api/v1/models/unload", {"model": chat})
        t.join(120)
        _assert_alive(server)
        assert st == 200, body
        status, answer = out["r"]
        # finished before the model went, or refused cleanly: never a dropped connection
        assert status in (200, 503), (status, answer)
        if status == 503:
            assert answer["error"]["code"] == "model_unloaded"
        else:
            assert len(answer["tokens"]) > 200_000


def test_unload_while_a_big_embedding_batch_runs(server: ServeProc) -> None:
    _, emb = _ids(server)
    inputs = [f"sentence number {i} about cats and the weather" for i in range(2000)]
    for delay in (0.0, 0.2, 1.0):
        assert server.post("/api/v1/models/load", {"model": emb})[0] == 200
        t, out = _in_background(
            lambda: server.post("/v1/embeddings", {"model": emb, "input": inputs})
        )
        time.sleep(delay)
        server.post("/api/v1/models/unload", {"model": emb})
        t.join(180)
        _assert_alive(server)
        status, answer = out["r"]
        assert status in (200, 503), (status, answer)
        if status == 200:
            assert len(answer["data"]) == 2000
    # the model loads again on the next request and answers
    st, body = server.post("/v1/embeddings", {"model": emb, "input": "a cat"})
    assert st == 200 and len(body["data"][0]["embedding"]) == 384


def test_unload_during_streams_ends_them_cleanly(server: ServeProc) -> None:
    import openai

    chat, _ = _ids(server)
    client = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0, timeout=120)
    for _ in range(3):
        assert server.post("/api/v1/models/load", {"model": chat})[0] == 200
        stream = client.chat.completions.create(
            model=chat,
            messages=[{"role": "user", "content": "Count from 1 to 500."}],
            max_tokens=400,
            temperature=0,
            stream=True,
        )
        first = next(iter(stream))  # the stream is running
        assert first.choices[0].delta.role == "assistant"
        server.post("/api/v1/models/unload", {"model": chat})
        with pytest.raises(openai.APIError):
            for _chunk in stream:  # ends with an error event, never a normal [DONE]
                pass
        _assert_alive(server)
    answer = client.chat.completions.create(
        model=chat, messages=[{"role": "user", "content": "Hi"}], max_tokens=4
    )
    assert answer.choices[0].message.content is not None
