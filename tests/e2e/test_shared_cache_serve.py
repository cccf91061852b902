"""Two real ``hearth serve`` gateways (their own HEARTH_HOMEs, ``--state URL --cache exact``,
SmolLM2 preloaded) sharing one real redis-server: a greedy chat answered through one is served
from the cache through the other, and the shared stats count both."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.support.hearthproc import DEADLINE, Server, hearth, wait_until


def chat(root: str, model: str, ask: str = "Name a fruit.") -> tuple[str | None, str]:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": ask}],
        "temperature": 0,
        "max_tokens": 8,
    }
    req = urllib.request.Request(
        root + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=DEADLINE) as r:
        assert r.status == 200
        out = json.loads(r.read())
        return r.headers.get("x-hearth-cache"), out["choices"][0]["message"]["content"]


def gateway(home: Path, url: str, *models: Path, mode: str = "exact") -> Server:
    preload = [a for m in models for a in ("--model", str(m))]
    srv = Server(home, None, "--state", url, "--cache", mode, *preload)
    wait_until(lambda: srv.api("GET", "/health")[1].get("state") == "ready", "the preload")
    return srv


@pytest.mark.model
def test_an_answer_through_one_gateway_is_a_hit_through_the_other(
    tmp_path: Path, smollm2_path: Path, redis_server: Any
) -> None:
    a = gateway(tmp_path / "a", redis_server.url, smollm2_path)
    try:
        b = gateway(tmp_path / "b", redis_server.url, smollm2_path)
        try:
            model = a.api("GET", "/v1/models")[1]["data"][0]["id"]
            assert model == b.api("GET", "/v1/models")[1]["data"][0]["id"]
            first, text = chat(a.root, model)
            assert first == "miss" and text
            again, replayed = chat(b.root, model)
            assert again == "hit" and replayed == text
        finally:
            assert b.stop() == 0
    finally:
        assert a.stop() == 0
    (tmp_path / "a" / "config").mkdir(parents=True, exist_ok=True)
    settings = tmp_path / "a" / "config" / "settings.json"
    raw = json.loads(settings.read_text()) if settings.exists() else {}
    settings.write_text(json.dumps({**raw, "state": {"url": redis_server.url}}))
    r = hearth(tmp_path / "a", None, "cache", "stats", "--json")
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert (got["entries"], got["hits"], got["misses"]) == (1, 1, 1)


@pytest.mark.model
def test_a_paraphrase_through_the_other_gateway_is_a_semantic_hit_on_minilm(
    tmp_path: Path, smollm2_path: Path, embedding_gguf: Path, redis_server: Any
) -> None:
    servers = []
    try:
        for name in ("a", "b"):
            (tmp_path / name / "config").mkdir(parents=True)
            (tmp_path / name / "config" / "settings.json").write_text(
                json.dumps({"cache": {"embedding_model": "all-minilm-l6-v2-q8_0"}})
            )
            servers.append(
                gateway(
                    tmp_path / name,
                    redis_server.url,
                    smollm2_path,
                    embedding_gguf,
                    mode="semantic",
                )  # fmt: skip
            )
        a, b = servers
        model = next(
            m["id"] for m in a.api("GET", "/v1/models")[1]["data"] if "smollm2" in m["id"].lower()
        )
        first, text = chat(a.root, model, "What is the capital of France?")
        assert first == "miss"
        # MiniLM puts these at cosine 0.99: over the default threshold of 0.9
        near, replayed = chat(b.root, model, "What's the capital of France?")
        assert near == "semantic" and replayed == text
        assert chat(b.root, model, "How do I bake sourdough bread?")[0] == "miss"
    finally:
        for srv in servers:
            assert srv.stop() == 0


def test_a_state_url_that_names_no_redis_is_refused(tmp_path: Path) -> None:
    r = hearth(tmp_path / "h", None, "serve", "--port", "0", "--state", "http://127.0.0.1:6379")
    assert r.returncode == 2  # a usage error, as any bad flag
    assert "is not a Redis URL" in r.stderr and "Traceback" not in r.stderr
