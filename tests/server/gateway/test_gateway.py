"""The gateway on a real server (SmolLM2 and the MiniLM embedder): aliases on all four
protocols and in the listings, the CLI changing them under a running server, fallback on a
model that does not fit, no fallback on a 400, default_model, auto."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from app.core.gateway import parse_rules
from app.settings import RoutingSettings, SettingsStore
from tests.conftest import Served, serving


@pytest.fixture(scope="module")
def gw(
    tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path, embedding_gguf: Path
) -> Iterator[Served]:
    with serving(tmp_path_factory.mktemp("gateway"), smollm2_path, embedding_gguf) as s:
        yield s


def _emb_id(s: Served) -> str:
    return next(m.model.id for m in s.service.models.all() if m.model.extra.get("embedding"))  # type: ignore[attr-defined]


def _store(s: Served) -> SettingsStore:
    return SettingsStore(s.home / "config" / "settings.json")


def hearth(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HEARTH_HOME": str(home)}
    return subprocess.run(
        [sys.executable, "-m", "app", *args], capture_output=True, text=True, env=env, timeout=120
    )


def call(s: Served, method: str, path: str, body: Any = None) -> tuple[int, dict[str, str], Any]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(s.root + path, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            raw = r.read().decode()
            status, headers = r.status, dict(r.headers)
    except urllib.error.HTTPError as e:
        raw, status, headers = e.read().decode(), e.code, dict(e.headers)
    try:
        return status, headers, json.loads(raw)
    except ValueError:
        return status, headers, raw  # a stream


CHAT = {"messages": [{"role": "user", "content": "Say hello"}], "max_tokens": 3}


def test_alias_set_by_the_cli_reaches_the_running_server(gw: Served) -> None:
    r = hearth(gw.home, "alias", "set", "gpt-4o-mini", gw.model_id)
    assert r.returncode == 0, r.stderr
    _, _, models = call(gw, "GET", "/v1/models")
    alias = next(m for m in models["data"] if m["id"] == "gpt-4o-mini")
    assert alias["owned_by"] == "alias" and alias["targets"] == [gw.model_id]
    _, _, tags = call(gw, "GET", "/api/tags")
    assert any(m["name"] == "gpt-4o-mini:latest" for m in tags["models"])
    r = hearth(gw.home, "alias", "ls", "--json")
    assert json.loads(r.stdout) == [{"alias": "gpt-4o-mini", "targets": [gw.model_id]}]


@pytest.mark.parametrize(
    ("path", "extra", "model_of"),
    [
        ("/v1/chat/completions", {}, lambda b: b["model"]),
        ("/v1/chat/completions", {"stream": True}, None),
        ("/v1/completions", {"prompt": "Hello", "messages": None}, lambda b: b["model"]),
        ("/v1/messages", {}, lambda b: b["model"]),
        (
            "/v1/responses",
            {"input": "Hi", "messages": None, "max_tokens": None, "max_output_tokens": 16},
            lambda b: b["model"],
        ),
        ("/api/chat", {"stream": False, "options": {"num_predict": 3}}, lambda b: b["model"]),
    ],
)
def test_an_alias_answers_on_every_protocol(
    gw: Served, path: str, extra: dict[str, Any], model_of: Any
) -> None:
    hearth(gw.home, "alias", "set", "gpt-4o-mini", gw.model_id)
    body = {k: v for k, v in {**CHAT, **extra, "model": "gpt-4o-mini"}.items() if v is not None}
    status, headers, out = call(gw, "POST", path, body)
    assert status == 200, out
    assert headers["x-hearth-route"] == gw.model_id
    if model_of is None:  # a stream: every chunk names the model that answered
        chunks = [json.loads(x[6:]) for x in out.splitlines() if x.startswith("data: {")]
        assert chunks and all(c["model"] == gw.model_id for c in chunks)
    else:
        assert model_of(out) == gw.model_id


def test_an_alias_on_the_model_routes_show_and_tokenize(gw: Served) -> None:
    """/v1/models/{alias}, Ollama's /api/show and /tokenize take an alias (its first local
    target) as they take a model id."""
    assert hearth(gw.home, "alias", "set", "claude-sonnet-4", gw.model_id).returncode == 0
    status, _, one = call(gw, "GET", "/v1/models/claude-sonnet-4")
    assert status == 200 and one["owned_by"] == "alias" and one["targets"] == [gw.model_id]
    status, _, shown = call(gw, "POST", "/api/show", {"model": "claude-sonnet-4"})
    _, _, direct = call(gw, "POST", "/api/show", {"model": gw.model_id})
    assert status == 200 and shown["model_info"] == direct["model_info"]
    body = {"content": "hello world"}
    status, _, toks = call(gw, "POST", "/tokenize", {**body, "model": "claude-sonnet-4"})
    _, _, want = call(gw, "POST", "/tokenize", {**body, "model": gw.model_id})
    assert status == 200 and toks["tokens"] == want["tokens"] and toks["tokens"]
    status, _, missing = call(gw, "POST", "/api/show", {"model": "no-such-alias"})
    assert status == 404, missing


def test_a_400_from_the_first_target_does_not_fall_back(gw: Served) -> None:
    emb = _emb_id(gw)
    assert hearth(gw.home, "alias", "set", "wrong-first", emb, gw.model_id).returncode == 0
    status, headers, out = call(
        gw, "POST", "/v1/chat/completions", {**CHAT, "model": "wrong-first"}
    )
    assert status == 400, out
    assert headers["x-hearth-route"] == emb  # the second target was never tried


def test_default_model_when_the_request_names_none(gw: Served) -> None:
    status, _, out = call(gw, "POST", "/v1/chat/completions", CHAT)
    assert status == 400 and out["error"]["param"] == "model"
    store = _store(gw)
    store.update(default_model=gw.model_id)
    try:
        status, headers, out = call(gw, "POST", "/v1/chat/completions", CHAT)
        assert status == 200 and out["model"] == gw.model_id
        status, _, out = call(gw, "POST", "/v1/chat/completions", {**CHAT, "model": ""})
        assert status == 200 and out["model"] == gw.model_id
    finally:
        store.update(default_model="")


def test_auto_picks_by_keyword_and_refuses_what_no_rule_matches(gw: Served) -> None:
    store = _store(gw)
    store.update(
        routing=RoutingSettings(parse_rules([{"target": gw.model_id, "keywords": ["hello"]}]))
    )
    try:
        status, headers, out = call(gw, "POST", "/v1/chat/completions", {**CHAT, "model": "auto"})
        assert status == 200 and out["model"] == gw.model_id
        assert headers["x-hearth-route"] == gw.model_id
        other = {**CHAT, "model": "auto", "messages": [{"role": "user", "content": "Bye"}]}
        status, _, out = call(gw, "POST", "/v1/chat/completions", other)
        assert status == 400 and "no 'auto' routing rule matches" in out["error"]["message"]
    finally:
        store.update(routing=RoutingSettings())


def test_a_target_that_does_not_fit_falls_to_the_next(gw: Served) -> None:
    """The chain's first target (SmolLM2) does not fit a budget set between the two models'
    estimates (507); the second (MiniLM) answers, and the route names both."""
    emb = _emb_id(gw)
    gw.call(gw.service.models.unload(gw.model_id))  # type: ignore[attr-defined]
    assert hearth(gw.home, "alias", "set", "emb-chain", gw.model_id, emb).returncode == 0
    # a budget between the two models' own estimates (calibrated by earlier loads, so they
    # are read here rather than assumed): the first target cannot fit, the second can
    small = gw.service.models.estimate(emb)["calibrated_total"]  # type: ignore[attr-defined]
    large = gw.service.models.estimate(gw.model_id)["calibrated_total"]  # type: ignore[attr-defined]
    assert small < large, (small, large)
    store = _store(gw)
    before = store.load().load
    store.update(load=replace(before, memory_budget_bytes=(small + large) // 2))
    try:
        status, headers, out = call(
            gw, "POST", "/v1/embeddings", {"model": "emb-chain", "input": "hi"}
        )
        assert status == 200, out
        assert headers["x-hearth-route"] == f"{gw.model_id},{emb}"
        assert out["model"] == emb and len(out["data"][0]["embedding"]) == 384
        status, headers, out = call(
            gw, "POST", "/v1/embeddings", {"model": gw.model_id, "input": "hi"}
        )
        assert status == 507  # alone, the same target answers its own failure
    finally:
        store.update(load=before)


def test_alias_cli_without_a_server(tmp_path: Path, smollm2_path: Path) -> None:
    r = hearth(tmp_path, "import", str(smollm2_path))
    mid = r.stdout.strip()
    assert hearth(tmp_path, "alias", "set", "a", mid).returncode == 0
    assert hearth(tmp_path, "alias", "set", "b", "a").returncode == 0
    r = hearth(tmp_path, "alias", "set", "a", "b")
    assert r.returncode == 1 and "alias cycle: a -> b -> a" in r.stderr
    r = hearth(tmp_path, "alias", "set", "auto", mid)
    assert r.returncode == 1 and "reserved" in r.stderr
    r = hearth(tmp_path, "alias", "set", mid, "a")
    assert r.returncode == 1 and "model id" in r.stderr
    out = json.loads(hearth(tmp_path, "alias", "ls", "--json").stdout)
    assert out == [{"alias": "a", "targets": [mid]}, {"alias": "b", "targets": ["a"]}]
    assert hearth(tmp_path, "alias", "rm", "b").returncode == 0
    assert hearth(tmp_path, "alias", "rm", "b").returncode == 1
    assert [x["alias"] for x in json.loads(hearth(tmp_path, "alias", "ls", "--json").stdout)] == [
        "a"
    ]
