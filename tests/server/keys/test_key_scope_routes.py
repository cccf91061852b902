"""A key's model scope on the real server, on every route that names a model: counting tokens
and reranking outside the scope answer as for an unknown model and load nothing; listings show
an alias only with its targets in scope; metrics leave out other models' series; the response
cache keeps each key's answers to itself unless ``cache.scope`` is ``shared``."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.cli import main
from app.core.gateway.cache.store import CacheConfig
from app.core.gateway.keys import KeyStore
from app.settings import SettingsStore
from tests.conftest import Served, serving

pytestmark = pytest.mark.model

UNKNOWN = "no-such-model-here"


@dataclass
class Keyed:
    s: Served
    keys: dict[str, str]  # name -> secret
    smol: str
    emb: str
    settings: SettingsStore

    def get(self, path: str, key: str) -> httpx.Response:
        return httpx.get(self.s.root + path, headers=auth(self.keys[key]), timeout=60)

    def post(self, path: str, body: object, key: str) -> httpx.Response:
        return httpx.post(self.s.root + path, json=body, headers=auth(self.keys[key]), timeout=120)

    def loaded(self) -> set[str]:
        return {m["id"] for m in self.get("/api/v1/ps", "admin").json()["models"]}


def auth(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


@pytest.fixture(scope="module")
def keyed(
    tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path, embedding_gguf: Path
) -> Iterator[Keyed]:
    secrets = {n: f"k-{n}-0123456789" for n in ("admin", "chat", "embed", "a", "b")}
    made: dict[str, Any] = {}

    def prepare(service: Any, paths: Any, store: SettingsStore) -> None:
        smol = next(s.model for s in service.models.all())
        emb, _ = service.models.import_path(embedding_gguf)
        service.routing.set_alias("both", [smol.id, emb.id])
        ks = KeyStore(paths.keys_file)
        ks.add("admin", secrets["admin"], admin=True)
        ks.add("chat", secrets["chat"], models=[smol.id])
        ks.add("embed", secrets["embed"], models=[emb.id])
        ks.add("a", secrets["a"])
        ks.add("b", secrets["b"])
        made.update(emb=emb.id, store=store)

    with serving(tmp_path_factory.mktemp("scope"), smollm2_path, prepare=prepare) as s:
        yield Keyed(s, secrets, s.model_id, made["emb"], made["store"])


def _as_unknown(r: httpx.Response, name: str) -> tuple[int, str]:
    return r.status_code, r.text.replace(name, "NAME")


def _count(model: str) -> dict[str, Any]:
    return {"model": model, "ttl": -1, "messages": [{"role": "user", "content": "hi"}]}


def test_counting_tokens_outside_the_scope_answers_as_unknown_and_loads_nothing(
    keyed: Keyed,
) -> None:
    for model in (keyed.smol, keyed.emb):
        keyed.post("/api/v1/models/unload", {"model": model}, "admin")
    # the embedder (an "is an embedding model" answer before) and the chat model, each
    # outside the other key's scope, answer byte for byte as a model that does not exist
    for key, hidden in (("chat", keyed.emb), ("embed", keyed.smol)):
        r = keyed.post("/v1/messages/count_tokens", _count(hidden), key)
        missing = keyed.post("/v1/messages/count_tokens", _count(UNKNOWN), key)
        assert r.status_code == 404, r.text
        assert r.json()["error"]["type"] == missing.json()["error"]["type"] == "not_found_error"
        assert _as_unknown(r, hidden) == _as_unknown(missing, UNKNOWN)
    assert keyed.loaded() == set()  # no load of a hidden model, ttl -1 or not
    r = keyed.post("/v1/messages/count_tokens", _count(keyed.smol), "chat")
    assert r.status_code == 200 and r.json()["input_tokens"] > 0
    # an alias counts as chat resolves it: its first target in the key's scope
    r = keyed.post("/v1/messages/count_tokens", _count("both"), "chat")
    assert r.status_code == 200 and r.json()["input_tokens"] > 0


def test_rerank_tokenize_and_infill_outside_the_scope_answer_as_unknown(keyed: Keyed) -> None:
    keyed.post("/api/v1/models/unload", {"model": keyed.emb}, "admin")
    cases = [
        ("/v1/rerank", lambda m: {"model": m, "query": "cats", "documents": ["a cat", "a car"]}),
        ("/tokenize", lambda m: {"model": m, "content": "hi"}),
        ("/tokenize", lambda m: {"model": m, "prompt": "hi"}),
        ("/detokenize", lambda m: {"model": m, "tokens": [1]}),
        ("/tokenizer_info", lambda m: {"model": m}),
        ("/api/v1/models/estimate", lambda m: {"model": m}),
        ("/infill", lambda m: {"model": m, "input_prefix": "a", "input_suffix": "b"}),
    ]
    for path, body in cases:
        hidden = keyed.post(path, body(keyed.emb), "chat")
        missing = keyed.post(path, body(UNKNOWN), "chat")
        assert hidden.status_code == 404, (path, hidden.text)
        assert _as_unknown(hidden, keyed.emb) == _as_unknown(missing, UNKNOWN), path
    assert keyed.emb not in keyed.loaded()


def test_alias_targets_are_listed_within_the_scope(keyed: Keyed) -> None:
    def alias(r: httpx.Response, field: str, name: str) -> dict[str, Any]:
        assert r.status_code == 200, r.text
        return next(m for m in r.json()[field] if m.get("id", m.get("name")) == name)

    assert alias(keyed.get("/v1/models", "a"), "data", "both")["targets"] == [
        keyed.smol,
        keyed.emb,
    ]
    assert alias(keyed.get("/v1/models", "chat"), "data", "both")["targets"] == [keyed.smol]
    assert alias(keyed.get("/api/tags", "embed"), "models", "both:latest")["targets"] == [keyed.emb]
    r = keyed.get("/v1/models/both", "chat")
    assert r.status_code == 200 and r.json()["targets"] == [keyed.smol]


def test_metrics_leave_out_the_series_of_models_outside_the_scope(keyed: Keyed) -> None:
    r = keyed.post("/v1/embeddings", {"model": keyed.emb, "input": "hi"}, "admin")
    assert r.status_code == 200, r.text
    r = keyed.post("/v1/messages/count_tokens", _count(keyed.smol), "admin")
    assert r.status_code == 200, r.text
    everything = keyed.get("/api/v1/metrics", "admin").json()["models"]
    assert {keyed.smol, keyed.emb} <= set(everything)
    assert keyed.emb not in keyed.get("/api/v1/metrics", "chat").json()["models"]
    assert keyed.smol in keyed.get("/api/v1/metrics", "chat").json()["models"]
    label = f'model="{keyed.emb}"'
    assert label in keyed.get("/metrics", "admin").text
    text = keyed.get("/metrics", "chat").text
    assert label not in text
    assert f'model="{keyed.smol}"' in text


def _ask(k: Keyed, key: str, content: str) -> str | None:
    body = {
        "model": k.smol,
        "messages": [{"role": "user", "content": content}],
        "temperature": 0,
        "max_tokens": 8,
    }
    r = k.post("/v1/chat/completions", body, key)
    assert r.status_code == 200, r.text
    return r.headers.get("x-hearth-cache")


def _cache(k: Keyed, **cfg: Any) -> None:
    k.settings.update(cache=CacheConfig(**cfg))
    assert main(["cache", "clear"]) == 0


def test_a_key_never_gets_another_keys_cached_answer(keyed: Keyed) -> None:
    _cache(keyed, mode="exact")
    assert _ask(keyed, "a", "Name a colour.") == "miss"
    assert _ask(keyed, "a", "Name a colour.") == "hit"
    assert _ask(keyed, "b", "Name a colour.") == "miss"  # not a's answer
    assert _ask(keyed, "b", "Name a colour.") == "hit"  # its own
    assert main(["cache", "stats"]) == 0


def test_semantic_matches_stay_within_one_key(keyed: Keyed) -> None:
    _cache(keyed, mode="semantic", embedding_model=keyed.emb, semantic_threshold=0.8)
    assert _ask(keyed, "a", "What is the capital of France?") == "miss"
    assert _ask(keyed, "a", "What is the capital of France") == "semantic"
    assert _ask(keyed, "b", "What is the capital of France") == "miss"


def test_cache_scope_shared_shares_answers_across_keys(keyed: Keyed) -> None:
    _cache(keyed, mode="exact", scope="shared")
    assert _ask(keyed, "a", "Name a fruit.") == "miss"
    assert _ask(keyed, "b", "Name a fruit.") == "hit"
    _cache(keyed, mode="off")


def test_health_names_only_the_loaded_models_a_caller_may_see(keyed: Keyed) -> None:
    """/health needs no key (probes), so it must not list loaded models to everyone: no
    valid key, no model ids; a scoped key, the ones in its scope; an admin key, all."""
    for model in (keyed.smol, keyed.emb):
        r = keyed.post("/api/v1/models/load", {"model": model}, "admin")
        assert r.status_code == 200, r.text
    anon = httpx.get(keyed.s.root + "/health", timeout=60)
    wrong = httpx.get(keyed.s.root + "/health", headers=auth("not-a-key"), timeout=60)
    for r in (anon, wrong):
        assert r.status_code == 200 and r.json()["status"] == "ok", r.text
        assert r.json()["loaded"] == [] and r.json()["loading"] == []
    assert keyed.get("/health", "embed").json()["loaded"] == [keyed.emb]
    assert set(keyed.get("/health", "admin").json()["loaded"]) == {keyed.smol, keyed.emb}
