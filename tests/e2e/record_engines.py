"""Record what real engines answer, into tests/fixtures/engines/<kind>/ (run by hand, not collected).

    PYTHONPATH=$PWD python tests/e2e/record_engines.py [llama-cpp-python] [llama.cpp]

Each answer body is saved byte for byte; manifest.json says, per file, the request, the status,
the content type and the engine's version. Timestamps and ids in the bodies are as recorded.
"""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.conftest import SHARED_TESTDATA, smollm2_file  # noqa: E402
from tests.e2e.engines import (  # noqa: E402
    Engine,
    free_port,
    http_request,
    llama_server_argv,
    llama_server_binary,
    start_llama_cpp_python,
    start_llama_server,
)
from tests.support.cross_encoder import write_cross_encoder  # noqa: E402

OUT = REPO / "tests" / "fixtures" / "engines"
KEY = "recorded-key"
CHAT = {
    "messages": [{"role": "user", "content": "Say hello."}],
    "max_tokens": 4,
    "temperature": 0,
}
LONG = " ".join(["word"] * 1500)  # over the 1024-token context


class Recorder:
    def __init__(self, folder: Path, version: str) -> None:
        self.folder = folder
        self.version = version
        folder.mkdir(parents=True, exist_ok=True)
        self.manifest: dict[str, Any] = {}

    def save(self, name: str, e: Engine, method: str, path: str, body: Any = None, **kw: Any):
        r = e.request(method, path, body, **kw)
        (self.folder / name).write_bytes(r.raw)
        req: dict[str, Any] = {"method": method, "path": path}
        if body is not None:
            req["body"] = body if len(json.dumps(body)) < 400 else "(long prompt, see script)"
        if "key" in kw:
            req["authorization"] = f"Bearer {kw['key']}"
        self.manifest[name] = {
            "engine": e.kind,
            "version": self.version,
            "request": req,
            "status": r.status,
            "content_type": r.headers.get("content-type", ""),
        }
        return r

    def write_manifest(self) -> None:
        (self.folder / "manifest.json").write_text(json.dumps(self.manifest, indent=1) + "\n")


def common(rec: Recorder, chat: Engine, mid: str) -> None:
    rec.save("models.json", chat, "GET", "/v1/models")
    rec.save("chat.json", chat, "POST", "/v1/chat/completions", {"model": mid, **CHAT})
    stream = {"model": mid, **CHAT, "stream": True, "stream_options": {"include_usage": True}}
    rec.save("chat-stream.sse", chat, "POST", "/v1/chat/completions", stream)
    bad = {"model": mid, "messages": "not a list"}
    rec.save("error-bad-request.json", chat, "POST", "/v1/chat/completions", bad)
    rec.save("error-wrong-key.json", chat, "GET", "/v1/models", key="wrong-key")
    rec.save(
        "error-wrong-key-chat.json",
        chat,
        "POST",
        "/v1/chat/completions",
        {"model": mid, **CHAT},
        key="wrong-key",
    )
    unknown = {"model": "no-such-model", **CHAT}
    rec.save("chat-unknown-model.json", chat, "POST", "/v1/chat/completions", unknown)
    too_long = {"model": mid, "messages": [{"role": "user", "content": LONG}], "max_tokens": 4}
    rec.save("error-context-length.json", chat, "POST", "/v1/chat/completions", too_long)


def interrupted_stream(rec: Recorder, e: Engine, mid: str) -> None:
    """A long stream, and a second request sent once its first event arrived: llama_cpp.server
    (interrupt_requests=True) cuts the first short, llama-server (-np 1) queues the second."""
    body = {
        "model": mid,
        "messages": [{"role": "user", "content": "Write a long story."}],
        "max_tokens": 300,
        "temperature": 0,
        "logit_bias": {"2": -100},  # no <|im_end|>: it runs to max_tokens unless interrupted
        "stream": True,
    }
    conn = http.client.HTTPConnection("127.0.0.1", e.port, timeout=120)
    conn.request(
        "POST",
        "/v1/chat/completions",
        json.dumps(body),
        {"Content-Type": "application/json", **e.auth()},
    )
    resp = conn.getresponse()
    got = resp.readline()
    while not got.startswith(b"data:"):
        got += resp.readline()
    second = e.post("/v1/chat/completions", {"model": mid, **CHAT})
    try:
        rest = resp.read()
    except http.client.IncompleteRead as cut:
        rest = cut.partial
    conn.close()
    (rec.folder / "chat-stream-concurrent.sse").write_bytes(got + rest)
    rec.manifest["chat-stream-concurrent.sse"] = {
        "engine": e.kind,
        "version": rec.version,
        "request": {
            "method": "POST",
            "path": "/v1/chat/completions",
            "body": body,
            "note": f"a second chat sent after the first event (it answered {second.status})",
        },
        "status": resp.status,
        "content_type": resp.getheader("content-type", ""),
    }


def record_llama_cpp_python(tmp: Path) -> None:
    import llama_cpp

    rec = Recorder(OUT / "llama-cpp-python", f"llama-cpp-python {llama_cpp.__version__}")
    emb = SHARED_TESTDATA / "all-minilm-l6-v2-q8_0.gguf"
    chat_gguf = smollm2_file()
    assert chat_gguf is not None
    e = start_llama_cpp_python(tmp, chat_gguf, emb, api_key=KEY)
    try:
        common(rec, e, "smollm2")
        rec.save(
            "tokenize.json", e, "POST", "/extras/tokenize", {"model": "smollm2", "input": "Hi"}
        )
        rec.save("embeddings.json", e, "POST", "/v1/embeddings", {"model": "minilm", "input": "Hi"})
        rec.save(
            "error-embeddings-on-chat-model.json",
            e,
            "POST",
            "/v1/embeddings",
            {"model": "smollm2", "input": "Hi"},
        )
        rec.save("health.json", e, "GET", "/health")
        interrupted_stream(rec, e, "smollm2")
        rr = {"model": "smollm2", "query": "cats", "documents": ["a cat", "a car"]}
        rec.save("error-rerank.json", e, "POST", "/v1/rerank", rr)
    finally:
        e.close()
    rec.write_manifest()


def loading_health(rec: Recorder, exe: Path, gguf: Path, tmp: Path) -> None:
    """Poll a fresh llama-server's /health as fast as possible to catch its while-loading answer."""
    port = free_port()
    tmp.mkdir(parents=True, exist_ok=True)
    with (tmp / "loading.log").open("w") as log:
        proc = subprocess.Popen(
            llama_server_argv(exe, gguf, port, alias="smollm2", api_key=KEY),
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "LD_LIBRARY_PATH": str(exe.parent)},
            start_new_session=True,
        )
    try:
        end = time.monotonic() + 60
        while time.monotonic() < end:
            r = http_request(f"http://127.0.0.1:{port}/health", timeout=5)
            if r.status == 503:
                (rec.folder / "health-loading.json").write_bytes(r.raw)
                m = http_request(
                    f"http://127.0.0.1:{port}/v1/models",
                    timeout=5,
                    headers={"Authorization": f"Bearer {KEY}"},
                )
                (rec.folder / "models-loading.json").write_bytes(m.raw)
                for name, got, path in (
                    ("health-loading.json", r, "/health"),
                    ("models-loading.json", m, "/v1/models"),
                ):
                    rec.manifest[name] = {
                        "engine": "llama.cpp",
                        "version": rec.version,
                        "request": {"method": "GET", "path": path, "note": "while the model loads"},
                        "status": got.status,
                        "content_type": got.headers.get("content-type", ""),
                    }
                return
            if r.status == 200:
                print("llama-server was ready before a 503 was seen", file=sys.stderr)
                return
            time.sleep(0.005)
    finally:
        proc.kill()
        proc.wait(30)


def record_llama_cpp(tmp: Path) -> None:
    exe = llama_server_binary()
    if exe is None:
        print("llama-server not built; skipping llama.cpp", file=sys.stderr)
        return
    chat_gguf = smollm2_file()
    assert chat_gguf is not None
    v = subprocess.run(
        [str(exe), "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "LD_LIBRARY_PATH": str(exe.parent)},
    )
    version = " ".join((v.stdout + v.stderr).split()) or "unknown"
    rec = Recorder(
        OUT / "llama.cpp", f"llama.cpp llama-server {version} (vendored by llama-cpp-python 0.3.36)"
    )
    loading_health(rec, exe, chat_gguf, tmp / "loading")
    e = start_llama_server(tmp, chat_gguf, api_key=KEY)
    try:
        common(rec, e, "smollm2")
        rec.save("health.json", e, "GET", "/health")
        interrupted_stream(rec, e, "smollm2")
        rec.save("props.json", e, "GET", "/props")
        rec.save("tokenize.json", e, "POST", "/tokenize", {"content": "Hi"})
        rec.save(
            "error-embeddings-not-enabled.json",
            e,
            "POST",
            "/v1/embeddings",
            {"model": "smollm2", "input": "Hi"},
        )
    finally:
        e.close()
    emb = start_llama_server(
        tmp, SHARED_TESTDATA / "all-minilm-l6-v2-q8_0.gguf", embedding=True, api_key=KEY
    )
    try:
        rec.save(
            "embeddings.json", emb, "POST", "/v1/embeddings", {"model": "minilm", "input": "Hi"}
        )
        rec.save("models-embedder.json", emb, "GET", "/v1/models")
    finally:
        emb.close()
    ce = write_cross_encoder(SHARED_TESTDATA / "all-minilm-l6-v2-q8_0.gguf", tmp / "ce.gguf")
    rr = start_llama_server(tmp, ce, rerank=True, api_key=KEY)
    try:
        body = {"model": "reranker", "query": "cats", "documents": ["a cat", "a car", "dogs"]}
        rec.save("rerank.json", rr, "POST", "/v1/rerank", body)
        rec.save("rerank-top-n.json", rr, "POST", "/v1/rerank", {**body, "top_n": 2})
    finally:
        rr.close()
    rec.write_manifest()


def main(argv: list[str]) -> None:
    kinds = argv or ["llama-cpp-python", "llama.cpp"]
    with tempfile.TemporaryDirectory() as d:
        t0 = time.monotonic()
        if "llama-cpp-python" in kinds:
            record_llama_cpp_python(Path(d) / "lcp")
        if "llama.cpp" in kinds:
            record_llama_cpp(Path(d) / "lcpp")
        print(f"recorded in {time.monotonic() - t0:.1f}s", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1:])
