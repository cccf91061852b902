"""Models end to end: real llama.cpp + MLX models under one budget, JIT, TTL, presets, CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import openai
import pytest

from tests.conftest import start_served, stop_served

pytestmark = pytest.mark.model


def api(base: str, method: str, path: str, body: object | None = None) -> tuple[int, dict]:
    req = urllib.request.Request(
        base + path,
        data=json.dumps(body).encode() if body is not None else None,
        method=method,
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def hearth(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HEARTH_HOME": str(home)}
    return subprocess.run(
        [sys.executable, "-m", "app", *args], capture_output=True, text=True, env=env, timeout=180
    )


@pytest.fixture
def two_runtimes(tmp_path: Path, smollm2_path: Path):  # type: ignore[no-untyped-def]
    mlx = pytest.importorskip("mlx_lm", reason="needs mlx-lm")
    del mlx
    from tests.support.mlx_model import build_tiny_mlx_model

    folder = build_tiny_mlx_model(tmp_path / "src" / "Tiny-MLX")
    s = start_served(tmp_path / "h", smollm2_path)
    mlx_model, _ = s.service.models.import_path(folder)  # type: ignore[attr-defined]
    yield s, mlx_model.id
    stop_served(s)


def test_llama_and_mlx_side_by_side_with_ttl_and_cli(two_runtimes) -> None:  # type: ignore[no-untyped-def]
    s, mlx_id = two_runtimes
    c = openai.OpenAI(base_url=s.base_url, api_key="x", max_retries=0, timeout=120)
    # JIT both, with a per-request TTL on the MLX one (Ollama-style duration)
    c.chat.completions.create(
        model=s.model_id, messages=[{"role": "user", "content": "Hi"}], max_tokens=3
    )
    # a keep-alive long enough for `ps` to see it on any machine; a short one is tested below
    c.completions.create(
        model=mlx_id, prompt="hello", max_tokens=3, extra_body={"keep_alive": "10m"}
    )
    ps = hearth(s.home, "ps", "--json")
    assert ps.returncode == 0, ps.stderr
    loaded = {m["id"]: m for m in json.loads(ps.stdout)}
    assert set(loaded) == {s.model_id, mlx_id}
    assert loaded[mlx_id]["runtime"] == "mlx" and loaded[s.model_id]["runtime"] == "llama.cpp"
    assert loaded[mlx_id]["ttl"] == 600.0 and loaded[s.model_id]["memory_bytes"] > 50_000_000
    models = {m.id: m.model_dump() for m in c.models.list().data}
    assert models[mlx_id]["state"] == "loaded" and models[mlx_id]["runtime"] == "mlx"
    # the next request's keep-alive replaces it
    c.completions.create(
        model=mlx_id, prompt="hello", max_tokens=3, extra_body={"keep_alive": "1s"}
    )
    # the keep-alive runs out: the idle MLX model unloads by itself
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and s.service.models._scheduler.state(mlx_id) != "not-loaded":  # type: ignore[attr-defined]
        time.sleep(0.1)
    assert s.service.models._scheduler.state(mlx_id) == "not-loaded"  # type: ignore[attr-defined]
    assert {m.id: m.model_dump()["state"] for m in c.models.list().data}[mlx_id] == "not-loaded"
    # CLI load with options, pin, unload
    r = hearth(s.home, "load", mlx_id, "--ctx", "256", "--pin", "--json")
    assert r.returncode == 0, r.stderr
    # `load --json` prints id, action, options, context_length; ps says it is pinned
    assert json.loads(r.stdout)["context_length"] == 256, r.stdout
    pinned = {m["id"]: m["pinned"] for m in json.loads(hearth(s.home, "ps", "--json").stdout)}
    assert pinned[mlx_id] is True
    assert hearth(s.home, "unload", mlx_id).returncode == 0
    assert s.service.models._scheduler.state(mlx_id) == "not-loaded"  # type: ignore[attr-defined]


def test_budget_refusal_force_and_eviction_over_http(
    tmp_path: Path, smollm2_path: Path, embedding_gguf: Path
) -> None:
    s = start_served(tmp_path / "h", smollm2_path)
    try:
        emb, _ = s.service.models.import_path(embedding_gguf)  # type: ignore[attr-defined]
        root = s.root
        st, est = api(
            root,
            "POST",
            "/api/v1/models/estimate",
            {"model": s.model_id, "options": {"context_length": 1024}},
        )
        assert st == 200 and est["fits"] is True and est["kv_cache"] > 0
        st, est2 = api(
            root,
            "POST",
            "/api/v1/models/estimate",
            {"model": s.model_id, "options": {"context_length": 2048}},
        )
        assert est2["kv_cache"] == 2 * est["kv_cache"]
        # a budget that holds the chat model alone (at the default 2048 context)
        budget = est2["total"] + 10 * 2**20
        s.service.models._scheduler._budget = lambda: budget  # type: ignore[attr-defined]  # the settings hook
        st, body = api(
            root,
            "POST",
            "/api/v1/models/load",
            {"model": s.model_id, "options": {"context_length": 1024}, "pin": True},
        )
        assert st == 200 and body["pinned"] is True
        st, body = api(root, "POST", "/api/v1/models/load", {"model": emb.id})
        assert st == 507 and body["error"]["code"] == "insufficient_memory"
        assert "needs about" in body["error"]["message"]
        st, body = api(root, "POST", "/api/v1/models/load", {"model": emb.id, "force": True})
        assert st == 200, body
        st, body = api(root, "POST", "/api/v1/models/unload", {"model": emb.id})
        assert st == 200
        # unpinned, the chat model is evicted for the embedder (least recently used, idle)
        api(root, "POST", "/api/v1/models/pin", {"model": s.model_id, "pinned": False})
        st, body = api(root, "POST", "/api/v1/models/load", {"model": emb.id})
        assert st == 200, body
        st, ps = api(root, "GET", "/api/v1/ps")
        assert [m["id"] for m in ps["models"]] == [emb.id]
        # the JIT load of the chat model now evicts the embedder and serves
        c = openai.OpenAI(base_url=s.base_url, api_key="x", max_retries=0, timeout=120)
        c.completions.create(model=s.model_id, prompt="Hi", max_tokens=2)
        st, ps = api(root, "GET", "/api/v1/ps")
        assert [m["id"] for m in ps["models"]] == [s.model_id]
    finally:
        stop_served(s)


def test_preset_applies_to_jit_and_bad_options_400(tmp_path: Path, smollm2_path: Path) -> None:
    s = start_served(tmp_path / "h", smollm2_path)
    try:
        root = s.root
        st, body = api(
            root,
            "PUT",
            f"/api/v1/models/{s.model_id}/preset",
            {"context_length": 768, "ttl": "10m"},
        )
        assert st == 200 and body["preset"] == {"context_length": 768, "ttl": 600.0}
        assert (
            api(root, "GET", f"/api/v1/models/{s.model_id}/preset")[1]["preset"]["context_length"]
            == 768
        )
        c = openai.OpenAI(base_url=s.base_url, api_key="x", max_retries=0, timeout=120)
        c.completions.create(
            model=s.model_id, prompt="Hi", max_tokens=2
        )  # JIT load uses the preset
        st, ps = api(root, "GET", "/api/v1/ps")
        assert ps["models"][0]["context_length"] == 768 and ps["models"][0]["ttl"] == 600.0
        assert c.models.retrieve(s.model_id).model_dump()["context_length"] == 768
        st, body = api(root, "PUT", f"/api/v1/models/{s.model_id}/preset", {"kv_type": "q3"})
        assert st == 400 and body["error"]["param"] == "options.kv_type"
        st, body = api(
            root, "POST", "/api/v1/models/load", {"model": s.model_id, "options": {"warp": 1}}
        )
        assert st == 400 and body["error"]["param"] == "options.warp"
        st, body = api(root, "POST", "/api/v1/models/load", {"model": "ghost"})
        assert st == 404
    finally:
        stop_served(s)


def test_failed_load_is_clear_and_others_keep_serving(tmp_path: Path, smollm2_path: Path) -> None:
    s = start_served(tmp_path / "h", smollm2_path)
    try:
        c = openai.OpenAI(base_url=s.base_url, api_key="x", max_retries=0, timeout=120)
        c.completions.create(model=s.model_id, prompt="Hi", max_tokens=2)
        # a GGUF that passes the header check but that llama.cpp cannot load (no tensors it knows)
        import gguf
        import numpy as np

        bad = tmp_path / "src" / "broken.gguf"
        bad.parent.mkdir(parents=True)
        w = gguf.GGUFWriter(str(bad), "llama")
        w.add_context_length(128)
        w.add_tensor("nothing_llama_wants", np.zeros((4, 4), dtype=np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        m, _ = s.service.models.import_path(bad)  # type: ignore[attr-defined]
        with pytest.raises(openai.APIStatusError) as ei:
            c.completions.create(model=m.id, prompt="Hi", max_tokens=2)
        assert ei.value.status_code == 500 and ei.value.body["code"] == "model_load_failed"
        assert s.service.models._scheduler.state(m.id) == "not-loaded"  # type: ignore[attr-defined]
        # an MLX folder where mlx can't load it (no weights it knows) is also a clear error
        r = c.completions.create(model=s.model_id, prompt="Hi", max_tokens=2)
        assert r.choices[0].text is not None, "the loaded model kept serving"
    finally:
        stop_served(s)
