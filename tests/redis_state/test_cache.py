"""The response cache shared in a real redis-server: two "gateways" (each its own service on the
fake runtime over the real Worker, its own SQLite fallback, the real ResponseCache over a
RedisCacheStore) share answers, exact and semantic; a key's answers stay the key's; Redis keeps
the TTL; the entry bound and the semantic candidate bound hold; a clear removes only the cache's
keys; a killed Redis is a miss, never an error (a put to it is dropped with a log line), and
the gateway goes on with its local file;
``hearth cache stats|clear`` read and clear the shared cache when ``state.url`` is set."""

from __future__ import annotations

import asyncio
import json
import time
import zlib
from pathlib import Path
from typing import Any

import pytest
import redis

from app.core.engine.presets import PresetStore
from app.core.gateway import AliasStore
from app.core.gateway.cache.replay import ResponseCache, local_identity
from app.core.gateway.cache.store import CacheConfig, CachedAnswer, CacheStore, pack_vector
from app.core.inference.generation import Choices
from app.core.library.index import ModelLibrary
from app.core.requests import ChatRequest, EmbeddingRequest, Embeddings, RequestContext
from app.core.service import assemble
from app.core.types import ChatMessage, Delta, LoadOptions, SamplingParams, TokenLogprob, Usage
from app.redis_state.cache import SEMANTIC_CANDIDATES, RedisCacheStore
from app.redis_state.connection import SharedState
from tests.support.fakes import FakeRuntime
from tests.support.gguf_files import CHATML, write_model
from tests.support.hearthproc import hearth

GREEDY = SamplingParams(temperature=0.0)
ASK = "What is two and two?"


async def words(req: EmbeddingRequest) -> Embeddings:
    """The embedding model's stand-in: a bag of lower-cased words (a paraphrase that keeps the
    words is near; another question is far)."""
    vectors = []
    for text in req.inputs:
        v = [0.0] * 64
        for w in str(text).lower().replace("?", " ").split():
            v[zlib.crc32(w.encode()) % 64] += 1.0
        vectors.append(v)
    return Embeddings(vectors, prompt_tokens=1)


class Gateway:
    """One gateway: a service on the fake runtime whose response cache lives in the shared
    Redis (its own SQLite file as the fallback), as build_service wires it with --state."""

    def __init__(self, tmp: Path, name: str, model_file: Path, url: str, **config: Any) -> None:
        lib = ModelLibrary(tmp / name / "lib.json", tmp / name / "models")
        lib.import_path(model_file)  # the same file for every gateway: the same identity
        (model,) = lib.list()
        self.model = model.id
        self.runtime = FakeRuntime(delay=0.0, pieces=("Four", ".", " Done"))
        self.config = CacheConfig(mode="exact", **config)
        self.shared = SharedState(url)
        self.local = CacheStore(tmp / name / "response_cache.sqlite")
        self.store = RedisCacheStore(self.shared, local=self.local)
        presets = PresetStore(tmp / name / "presets.json")
        self.service = assemble(
            lib,
            {"gguf": self.runtime},
            load_defaults=LoadOptions,
            aliases=AliasStore(tmp / name / "aliases.json"),
            presets=presets,
            cache=lambda embed: ResponseCache(
                self.store,
                lambda: self.config,
                embed=words,
                identity=local_identity(lib, presets),
            ),
        )

    @property
    def submits(self) -> int:
        return sum(m.submit_calls for m in self.runtime.models)

    async def chat(
        self, text: str = ASK, partition: str = ""
    ) -> tuple[str | None, list[list[Delta]]]:
        req = ChatRequest(
            self.model,
            (ChatMessage("user", text),),
            sampling=GREEDY,
            context=RequestContext(partition=partition),
        )
        choices = await self.service.chat(req)
        return choices.cache, await drain(choices)

    async def close(self) -> None:
        await self.service.close()
        await self.shared.close()


async def drain(choices: Choices) -> list[list[Delta]]:
    return [[d async for d in await choices.get(i)] for i in range(choices.count)]


@pytest.fixture
def model_file(tmp_path: Path) -> Path:
    return write_model(tmp_path / "src" / "m.gguf", chat_template=CHATML)


async def gateways(tmp_path: Path, model_file: Path, url: str, **config: Any) -> list[Gateway]:
    out = [Gateway(tmp_path, n, model_file, url, **config) for n in ("a", "b")]
    for g in out:
        await g.shared.start()
        assert g.shared.usable
    return out


def text(deltas: list[Delta]) -> str:
    return "".join(d.text for d in deltas)


async def test_an_answer_cached_through_one_gateway_is_a_hit_through_another(
    tmp_path: Path, model_file: Path, redis_server: Any
) -> None:
    a, b = await gateways(tmp_path, model_file, redis_server.url)
    try:
        result, first = await a.chat()
        assert result == "miss" and a.submits == 1
        again, second = await b.chat()
        assert again == "hit" and b.submits == 0  # b's runtime never saw it
        assert text(second[0]) == text(first[0]) == "Four. Done"
        assert second[0][-1].finish_reason == first[0][-1].finish_reason
        u0, u1 = first[0][-1].usage, second[0][-1].usage
        assert u0 is not None and u1 is not None
        assert (u1.prompt_tokens, u1.completion_tokens) == (u0.prompt_tokens, u0.completion_tokens)
        stats = b.store.stats()
        assert (stats["entries"], stats["hits"], stats["misses"]) == (1, 1, 1)
        assert a.local.stats()["entries"] == 0  # nothing went to the fallback file
    finally:
        for g in (a, b):
            await g.close()


async def test_a_keys_answers_stay_its_own_across_gateways(
    tmp_path: Path, model_file: Path, redis_server: Any
) -> None:
    a, b = await gateways(tmp_path, model_file, redis_server.url)
    b.config = a.config = CacheConfig(mode="semantic", embedding_model="words")
    try:
        assert (await a.chat(partition="key-a"))[0] == "miss"
        assert (await b.chat(partition="key-b"))[0] == "miss"  # not key a's answer, nor near
        assert (await b.chat(ASK.lower(), partition="key-b"))[0] == "semantic"  # its own
        assert (await b.chat(partition="key-a"))[0] == "hit"
    finally:
        for g in (a, b):
            await g.close()


async def test_a_paraphrase_asked_through_another_gateway_is_a_semantic_hit(
    tmp_path: Path, model_file: Path, redis_server: Any
) -> None:
    a, b = await gateways(tmp_path, model_file, redis_server.url)
    b.config = a.config = CacheConfig(mode="semantic", embedding_model="words")
    try:
        assert (await a.chat())[0] == "miss"
        result, got = await b.chat("what is two and two")
        assert result == "semantic" and b.submits == 0 and text(got[0]) == "Four. Done"
        assert (await b.chat("Name a colour"))[0] == "miss"
        assert b.store.stats()["semantic_hits"] == 1
    finally:
        for g in (a, b):
            await g.close()


def answer(word: str) -> CachedAnswer:
    lp = TokenLogprob(word, -0.25, tuple(word.encode()), ((word, -0.25, tuple(word.encode())),))
    final = Delta(text="", finish_reason="stop", usage=Usage(5, 1))
    return CachedAnswer("m", ((Delta(text=word, logprobs=(lp,)), final),))


async def test_redis_keeps_the_ttl_and_forgets_the_expired_entry(redis_server: Any) -> None:
    shared = SharedState(redis_server.url)
    await shared.start()
    store = RedisCacheStore(shared)
    try:
        store.put("k", answer("hi"), time.time(), max_entries=10, ttl_s=1.0)
        assert store.get("k", time.time(), 1.0) == answer("hi")  # the deltas come back whole
        deadline = time.monotonic() + 30
        while store.get("k", time.time(), 1.0) is not None:
            assert time.monotonic() < deadline, "the entry never expired"
            await asyncio.sleep(0.1)
        assert shared.sync.zscore(store.prefix + "used", "k") is None  # dropped from the index
        assert store.stats()["entries"] == 0
    finally:
        await shared.close()


async def test_past_max_entries_the_least_recently_used_goes(redis_server: Any) -> None:
    shared = SharedState(redis_server.url)
    await shared.start()
    store = RedisCacheStore(shared)
    try:
        store.put("k1", answer("one"), 1.0e9, max_entries=2, ttl_s=60)
        store.put("k2", answer("two"), 1.0e9 + 1, max_entries=2, ttl_s=60)
        assert store.get("k1", 1.0e9 + 2, 60) is not None  # k1 used after k2
        store.put("k3", answer("three"), 1.0e9 + 3, max_entries=2, ttl_s=60)
        assert store.get("k2", 1.0e9 + 4, 60) is None
        assert store.get("k1", 1.0e9 + 4, 60) is not None
        assert store.get("k3", 1.0e9 + 4, 60) is not None
        assert store.stats()["entries"] == 2
        assert shared.sync.exists(store.prefix + "e:k2") == 0
    finally:
        await shared.close()


async def test_a_semantic_key_keeps_a_bounded_set_of_candidates(redis_server: Any) -> None:
    shared = SharedState(redis_server.url)
    await shared.start()
    store = RedisCacheStore(shared)
    try:
        n = SEMANTIC_CANDIDATES + 20

        def one_hot(i: int) -> list[float]:  # each entry's vector far from every other's
            v = [0.0] * n
            v[i] = 1.0
            return v

        for i in range(n):
            store.put(
                f"k{i}", answer(str(i)), 1.0e9 + i, max_entries=1000, ttl_s=60, skey="s",
                vector=one_hot(i),
            )  # fmt: skip
        assert shared.sync.hlen(store.prefix + "v:s") == SEMANTIC_CANDIDATES
        assert shared.sync.zcard(store.prefix + "s:s") == SEMANTIC_CANDIDATES
        assert not shared.sync.hexists(store.prefix + "v:s", "k0")  # the oldest went
        assert store.nearest("s", one_hot(0), 0.5, 1.0e9 + n, 60) is None
        last = n - 1
        v = one_hot(last)
        got = store.nearest("s", v, 0.999, 1.0e9 + n, 60)
        assert got is not None and got[0] == answer(str(last)) and got[1] > 0.999
        # an entry gone from under its candidate is dropped when a lookup picks it
        shared.sync.delete(store.prefix + f"e:k{last}")
        assert store.nearest("s", v, 0.9999, 1.0e9 + n, 60) is None
        assert not shared.sync.hexists(store.prefix + "v:s", f"k{last}")
    finally:
        await shared.close()


async def test_clear_removes_only_the_caches_keys(redis_server: Any) -> None:
    shared = SharedState(redis_server.url)
    await shared.start()
    store = RedisCacheStore(shared)
    try:
        shared.sync.set("someone-else:key", "1")
        shared.sync.set(shared.key("rl", "alice"), "7")  # another shared piece of Hearth
        store.put("k1", answer("one"), 1.0e9, max_entries=10, ttl_s=60)
        vec = [1.0, 0.0]
        store.put("k2", answer("two"), 1.0e9, max_entries=10, ttl_s=60, skey="s", vector=vec)
        store.count("misses")
        assert store.clear() == 2
        assert sorted(shared.sync.keys("*")) == [b"hearth:rl:alice", b"someone-else:key"]
        assert store.stats() == {
            "entries": 0, "bytes": 0, "hits": 0, "semantic_hits": 0, "misses": 0, "bypasses": 0
        }  # fmt: skip
    finally:
        await shared.close()


async def test_a_killed_redis_is_a_miss_and_the_gateway_goes_on_locally(
    tmp_path: Path, model_file: Path, redis_server: Any
) -> None:
    (a,) = [Gateway(tmp_path, "a", model_file, redis_server.url)]
    await a.shared.start()
    try:
        assert (await a.chat())[0] == "miss"
        redis_server.kill()
        result, got = await a.chat()  # the lookup fails: a miss, answered fresh
        assert result == "miss" and text(got[0]) == "Four. Done" and a.submits == 2
        status = a.shared.status()
        assert status["state"] == "degraded" and status["error"] and not a.shared.usable
        assert (await a.chat())[0] == "hit"  # kept in the local file meanwhile
        assert a.local.stats()["entries"] == 1
    finally:
        await a.close()


def test_the_cli_reads_and_clears_the_shared_cache(tmp_path: Path, redis_server: Any) -> None:
    home = tmp_path / "h"
    (home / "config").mkdir(parents=True)
    (home / "config" / "settings.json").write_text(json.dumps({"state": {"url": redis_server.url}}))
    r = redis.Redis.from_url(redis_server.url)
    shared = SharedState(redis_server.url)
    shared.succeeded()
    store = RedisCacheStore(shared)
    store.put("k1", answer("one"), time.time(), max_entries=10, ttl_s=60)
    store.count("misses")
    r.set("someone-else:key", "1")
    got = hearth(home, None, "cache", "stats", "--json")
    assert got.returncode == 0, got.stderr
    out = json.loads(got.stdout)
    assert (out["entries"], out["misses"]) == (1, 1) and out["bytes"] > 0
    cleared = hearth(home, None, "cache", "clear")
    assert cleared.returncode == 0 and cleared.stdout.strip() == "cleared 1 cached response"
    assert r.keys("*") == [b"someone-else:key"]
    redis_server.kill()
    down = hearth(home, None, "cache", "stats")
    assert down.returncode == 1 and "cannot reach the response cache" in down.stderr
    assert "Traceback" not in down.stderr
    r.close()
    shared.sync.close()


def test_vectors_are_packed_as_the_sqlite_store_packs_them(redis_server: Any) -> None:
    shared = SharedState(redis_server.url)
    shared.succeeded()
    store = RedisCacheStore(shared)
    store.put("k", answer("x"), 1.0e9, max_entries=5, ttl_s=60, skey="s", vector=[0.5, 2.0])
    assert shared.sync.hget(store.prefix + "v:s", "k") == pack_vector([0.5, 2.0])
    shared.sync.close()


async def test_a_put_to_a_killed_redis_is_dropped_with_a_log_line(
    redis_server: Any, caplog: pytest.LogCaptureFixture
) -> None:
    shared = SharedState(redis_server.url)
    await shared.start()
    store = RedisCacheStore(shared)  # no local file: nothing to fall back to
    try:
        redis_server.kill()  # the state does not know yet: the put tries Redis
        store.put("k", answer("hi"), time.time(), max_entries=10, ttl_s=60)
        assert not shared.usable and shared.status()["state"] == "degraded"
        assert any("not stored in the shared state" in r.getMessage() for r in caplog.records)
        assert store.get("k", time.time(), 60) is None  # degraded, no fallback: a miss
        store.count("misses")  # dropped, no error
    finally:
        await shared.close()
