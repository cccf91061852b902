"""The provider pool's own logic (states, listings, prefix ownership, a failed request's
re-probe) over a scripted RemoteClient: the seam every real engine test goes through too
(tests/e2e/providers/test_remote_providers.py and test_provider_failures.py drive real engines)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.core.gateway.providers import pool as pool_mod
from app.core.gateway.providers.base import Probe, RemoteModel
from app.core.gateway.providers.pool import ProviderPool
from app.core.gateway.providers.store import ProviderConfig, ProviderStore
from app.errors import ModelNotFound, ProviderError, ProviderUnavailable


class Scripted:
    """A client whose probe answers what the test sets, counting the probes."""

    first: Probe | None = None  # what a new client's probes answer (before a test changes it)

    def __init__(self, cfg: ProviderConfig, key: str | None) -> None:
        self.cfg, self.key = cfg, key
        self.answer = Scripted.first or Probe("ready", (RemoteModel("Qwen/Qwen3-8B", 32768),), 3.0)
        self.probes = 0
        self.probed = asyncio.Event()
        self.closed = False

    async def probe(self, *, detect: bool = False) -> Probe:
        self.probes += 1
        self.probed.set()
        return self.answer

    async def close(self) -> None:
        self.closed = True

    async def close_when_idle(self) -> None:
        await self.close()

    def __getattr__(self, name: str) -> Any:  # chat, embed...: not used here
        raise AttributeError(name)


@pytest.fixture(autouse=True)
def _reset_first() -> Iterator[None]:
    yield
    Scripted.first = None


@pytest.fixture
def setup(tmp_path: Path) -> tuple[ProviderStore, ProviderPool, dict[str, Scripted]]:
    store = ProviderStore(tmp_path / "providers.json", tmp_path / "keys.json")
    made: dict[str, Scripted] = {}

    def make(cfg: ProviderConfig, key: str | None) -> Scripted:
        made[cfg.name] = Scripted(cfg, key)
        return made[cfg.name]

    return store, ProviderPool(store, make), made  # type: ignore[arg-type]


async def _until(cond: Any) -> None:
    for _ in range(2000):
        if cond():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("condition never held")


async def test_ready_provider_lists_prefixed_models_and_resolves_exact_ids(setup: Any) -> None:
    store, pool, made = setup
    store.add(ProviderConfig("gpu", "http://h:8000/v1", kind="vllm"), "sk-1", lambda p: None)
    assert pool.states() == [{"name": "gpu", "state": "starting"}]  # not probed yet
    client, rid, model = await pool.client_for("gpu/Qwen/Qwen3-8B")  # waits for the first probe
    assert (rid, model and model.context_length) == ("Qwen/Qwen3-8B", 32768)
    assert made["gpu"].key == "sk-1"
    assert [r.id for r in pool.listings()] == ["gpu/Qwen/Qwen3-8B"]
    assert pool.statuses()[0].models == ("gpu/Qwen/Qwen3-8B",)
    with pytest.raises(ModelNotFound, match="serves no model 'qwen/qwen3-8b'"):
        await pool.client_for("gpu/qwen/qwen3-8b")  # ids keep the engine's case
    assert not pool.is_target("gpu/") and pool.owner("other/x") is None
    await pool.close()
    assert made["gpu"].closed


async def test_a_provider_that_is_down_lists_nothing_and_answers_503(setup: Any) -> None:
    store, pool, made = setup
    store.add(ProviderConfig("lan", "http://h:1/v1"), None, lambda p: None)
    Scripted.first = Probe("unreachable", error="connection refused")
    pool.states()
    await _until(lambda: pool.states()[0]["state"] == "unreachable")
    assert pool.listings() == [] and pool.statuses()[0].error == "connection refused"
    with pytest.raises(ProviderUnavailable, match="'lan' is unreachable: connection refused") as e:
        await pool.client_for("lan/x")
    assert e.value.status == 503 and e.value.code == "provider_unavailable"
    await pool.close()


async def test_a_failed_request_marks_it_and_probes_again_now(setup: Any, monkeypatch: Any) -> None:
    monkeypatch.setattr(pool_mod, "REFRESH_S", 3600.0)  # only a wake can cause a second probe
    store, pool, made = setup
    store.add(ProviderConfig("lan", "http://h:1/v1"), None, lambda p: None)
    await pool.client_for("lan/Qwen/Qwen3-8B")
    c = made["lan"]
    assert c.probes == 1
    c.answer = Probe("unreachable", error="refused")
    pool.failed("lan/Qwen/Qwen3-8B")
    assert pool.listings() == []  # at once, before the probe answers
    await _until(lambda: c.probes == 2)
    assert pool.states()[0]["state"] == "unreachable"
    await pool.close()


async def test_file_changes_rebuild_only_what_changed(setup: Any) -> None:
    store, pool, made = setup
    store.add(ProviderConfig("a", "http://h:1/v1"), None, lambda p: None)
    store.add(ProviderConfig("b", "http://h:2/v1"), None, lambda p: None)
    pool.states()
    first_a, first_b = made["a"], made["b"]
    store.add(ProviderConfig("b", "http://h:3/v1"), "new-key", lambda p: None)
    store.remove("a")
    assert [s["name"] for s in pool.states()] == ["b"]
    await _until(lambda: first_a.closed and first_b.closed)
    assert made["b"] is not first_b and made["b"].key == "new-key"
    await pool.close()


async def test_an_unauthorized_provider_answers_401_not_retryable(setup: Any) -> None:
    store, pool, made = setup
    store.add(ProviderConfig("lan", "http://h:1/v1"), "wrong", lambda p: None)
    Scripted.first = Probe("unauthorized", error="HTTP 401: invalid api key")
    pool.states()
    await _until(lambda: pool.states()[0]["state"] == "unauthorized")
    with pytest.raises(ProviderError) as e:
        await pool.client_for("lan/x")
    assert e.value.status == 401 and not e.value.retryable  # a chain does not move on
    await pool.close()
