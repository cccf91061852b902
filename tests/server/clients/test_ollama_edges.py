"""Every Ollama route answers its errors in Ollama's shape (``{"error": "..."}``), at the edge
(401, 403, 413) and in the handler (404, 400); and Ollama bodies have the bounds every protocol
has (``options.stop`` was unbounded on /api/chat and /api/generate)."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Served, start_served, stop_served

pytestmark = pytest.mark.model

KEY = "sk-ollama-edges"
AUTH = {"Authorization": f"Bearer {KEY}"}
LIMIT = 64 * 1024
MSGS = [{"role": "user", "content": "Hi"}]
GETS = ["/api/version", "/api/tags", "/api/ps"]
POSTS = ["/api/show", "/api/chat", "/api/generate", "/api/embed", "/api/embeddings"]


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path) -> Iterator[Served]:
    s = start_served(
        tmp_path_factory.mktemp("ollama-edges"), smollm2_path, api_key=KEY, max_body_bytes=LIMIT
    )
    yield s
    stop_served(s)


def call(
    s: Served, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None
) -> tuple[int, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=120)
    try:
        raw = (
            body
            if isinstance(body, bytes)
            else (b"" if body is None else json.dumps(body).encode())
        )
        conn.request(method, path, body=raw or None, headers=headers or {})
        r = conn.getresponse()
        return r.status, json.loads(r.read() or b"null")
    finally:
        conn.close()


def ollama_error(body: Any) -> str:
    assert isinstance(body, dict) and set(body) == {"error"}, body
    assert isinstance(body["error"], str) and body["error"]
    return body["error"]


def _body(s: Served, path: str, model: str) -> dict[str, Any]:
    extra = {
        "/api/chat": {"messages": MSGS},
        "/api/generate": {"prompt": "Hi"},
        "/api/embed": {"input": "Hi"},
        "/api/embeddings": {"prompt": "Hi"},
    }.get(path, {})
    return {"model": model, "stream": False, **extra}


@pytest.mark.parametrize(
    ("method", "path"), [("GET", p) for p in GETS] + [("POST", p) for p in POSTS]
)
def test_401_and_403_in_ollama_shape_on_every_route(keyed: Served, method: str, path: str) -> None:
    body = _body(keyed, path, keyed.model_id) if method == "POST" else None
    status, out = call(keyed, method, path, body)
    assert status == 401 and "API key" in ollama_error(out)
    status, out = call(keyed, method, path, body, {**AUTH, "Host": "evil.com"})
    assert status == 403 and "Host" in ollama_error(out)


@pytest.mark.parametrize("path", POSTS)
def test_413_and_404_in_ollama_shape_on_every_post_route(keyed: Served, path: str) -> None:
    big = {**_body(keyed, path, keyed.model_id), "pad": "x" * (2 * LIMIT)}
    status, out = call(keyed, "POST", path, big, AUTH)
    assert status == 413, out
    ollama_error(out)
    status, out = call(keyed, "POST", path, _body(keyed, path, "no-such-model"), AUTH)
    assert status == 404 and "no-such-model" in ollama_error(out)


def test_unknown_ollama_path_404_in_ollama_shape(keyed: Served) -> None:
    status, out = call(keyed, "GET", "/api/nothing-here", None, AUTH)
    assert status == 404
    ollama_error(out)


def _deep(n: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(n):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


def _tool(name: str, params: Any = None) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": params}}


ONE_TOKEN = {"num_predict": 1, "temperature": 0}


@pytest.mark.parametrize(
    ("path", "extra", "says"),
    [
        ("/api/chat", {"options": {**ONE_TOKEN, "stop": ["x"] * 17}}, "at most 16 strings"),
        ("/api/chat", {"options": {**ONE_TOKEN, "stop": ["s" * 2048]}}, "1024 characters"),
        ("/api/generate", {"options": {**ONE_TOKEN, "stop": ["x"] * 17}}, "at most 16 strings"),
        (
            "/api/generate",
            {"raw": True, "options": {**ONE_TOKEN, "stop": "s" * 2048}},
            "1024 characters",
        ),
        ("/api/chat", {"tools": [_tool(f"t{i}") for i in range(129)]}, "at most 128 tools"),
        ("/api/chat", {"tools": [_tool("not a name")]}, "name"),
        ("/api/chat", {"tools": [_tool("deep", _deep(200))]}, "nested deeper"),
    ],
)
def test_stop_and_tools_have_every_protocol_s_bounds(
    keyed: Served, path: str, extra: dict[str, Any], says: str
) -> None:
    body = {**_body(keyed, path, keyed.model_id), "options": ONE_TOKEN, **extra}
    status, out = call(keyed, "POST", path, body, AUTH)
    assert status == 400, out
    assert says in ollama_error(out)
