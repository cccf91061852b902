"""Small requests that expand, and big ones, are bounded before the work and never block the
event loop (item 5: a 31.5 MB /tokenize with_pieces blocked /health for 38 s at a
5.5 GB peak)."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from typing import Any

import pytest

from tests.conftest import Served

pytestmark = pytest.mark.model


def _post(s: Served, path: str, body: Any) -> tuple[int, dict[str, Any]]:
    req = urllib.request.Request(
        s.root + path, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _health_during(s: Served, work: Any) -> tuple[Any, float]:
    """Run ``work`` while polling /health; returns its result and the slowest /health."""
    out: dict[str, Any] = {}
    t = threading.Thread(target=lambda: out.setdefault("r", work()))
    t.start()
    slowest = 0.0
    while t.is_alive():
        t0 = time.monotonic()
        with urllib.request.urlopen(s.root + "/health", timeout=30) as r:
            assert r.status == 200
        slowest = max(slowest, time.monotonic() - t0)
        time.sleep(0.05)
    t.join()
    return out["r"], slowest


def test_a_31_mb_tokenize_with_pieces_is_refused_before_the_work(served: Served) -> None:
    content = "hello world " * (31_500_000 // 12)
    (status, body), slowest = _health_during(
        served,
        lambda: _post(
            served, "/tokenize", {"model": served.model_id, "content": content, "with_pieces": True}
        ),
    )
    assert status == 400 and body["error"]["param"] == "content", body
    assert "at most" in body["error"]["message"]
    assert slowest < 1.0, f"/health took {slowest:.2f}s"


def test_a_prompt_too_long_for_the_context_is_refused_without_tokenizing(served: Served) -> None:
    # 8 MB of text cannot fit 2,048 tokens whatever its tokens: refused on its byte length
    prompt = "lighthouse " * 750_000
    (status, body), slowest = _health_during(
        served,
        lambda: _post(
            served,
            "/v1/chat/completions",
            {"model": served.model_id, "messages": [{"role": "user", "content": prompt}]},
        ),
    )
    assert status == 400 and body["error"]["code"] == "context_length_exceeded", body
    assert "bytes" in body["error"]["message"]
    assert slowest < 1.0, f"/health took {slowest:.2f}s"


def test_too_many_embedding_inputs_are_refused_on_every_protocol(served: Served) -> None:
    inputs = ["x"] * 3000
    for path in ("/v1/embeddings", "/api/embed"):
        status, body = _post(served, path, {"model": served.model_id, "input": inputs})
        assert status == 400, (path, body)
        message = body["error"] if path.startswith("/api/") else body["error"]["message"]
        assert "2048" in message, (path, body)
