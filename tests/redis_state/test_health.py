"""Provider health shared through a real redis-server: what one gateway's board writes the
other reads (the ``hearth:health:<provider>`` hash), a dead Redis leaves each gateway its local
copy, and two gateways' pools over real HTTP engines: when one finds an engine down, the other
skips it without trying it (its route starts with the healthy member)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from app.core.gateway.auto import RequestFacts
from app.core.gateway.groups.health import Health
from app.core.gateway.groups.router import GroupRouter
from app.core.gateway.groups.store import GroupConfig, GroupStore
from app.core.gateway.providers import serve
from app.core.gateway.providers.pool import ProviderPool
from app.core.gateway.providers.store import ProviderConfig, ProviderStore
from app.core.gateway.resolve import Gateway, Routing
from app.core.requests import ChatRequest, RequestContext
from app.core.types import ChatMessage
from app.redis_state.connection import SharedState
from app.redis_state.health import RedisHealthBoard
from app.runtimes.remote.client import RemoteEngine
from tests.conftest import listen_loopback
from tests.e2e.providers.scripted_engine import Script, engine_app


async def test_what_one_board_writes_the_other_reads(redis_server: Any) -> None:
    a, b = SharedState(redis_server.url), SharedState(redis_server.url)
    await a.start()
    await b.start()
    try:
        one, two = RedisHealthBoard(a), RedisHealthBoard(b)
        assert two.get("gpu1") is None
        one.put("gpu1", Health("open", 2e9, "HTTP 502", 2))
        stored = a.sync.hgetall(a.key("health", "gpu1"))
        assert stored[b"state"] == b"open" and stored[b"error"] == b"HTTP 502"
        assert 0 < a.sync.ttl(a.key("health", "gpu1"))  # it expires by itself
        fresh = RedisHealthBoard(b)  # a gateway that never read it
        assert fresh.get("gpu1") == Health("open", 2e9, "HTTP 502", 2)
        one.put("gpu1", None)
        assert RedisHealthBoard(b).get("gpu1") is None
    finally:
        await a.close()
        await b.close()


async def test_a_dead_redis_leaves_the_local_copy_serving(redis_server: Any) -> None:
    state = SharedState(redis_server.url)
    await state.start()
    try:
        board = RedisHealthBoard(state, clock=lambda: 0.0)
        redis_server.kill()
        board.put("gpu1", Health("cooling", 2e9, "429", 0))  # Redis fails: degraded
        assert not state.usable
        assert board.get("gpu1") == Health("cooling", 2e9, "429", 0)  # from the local copy
    finally:
        await state.close()


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def _pool(
    tmp: Path, urls: dict[str, str], shared: SharedState, clock: Clock
) -> tuple[ProviderPool, Gateway]:
    store = ProviderStore(tmp / "providers.json", tmp / "keys.json")
    for name, url in urls.items():
        store.add(ProviderConfig(name, url + "/v1", kind="vllm"), None, lambda p: None)
    pool = ProviderPool(store, RemoteEngine, board=RedisHealthBoard(shared, clock=clock))
    groups = GroupStore(tmp / "groups.json")
    groups.set(GroupConfig("g", ("dead", "live")), store.all())
    router = GroupRouter(groups, pool)
    return pool, Gateway(None, Routing, pool.is_target, lambda m: False, router)


async def _ask(pool: ProviderPool, gateway: Gateway) -> list[str]:
    req = ChatRequest("g", (ChatMessage("user", "hi"),), max_tokens=2)

    async def start(target: str) -> Any:
        choices = await serve.chat(pool, ChatRequest(target, req.messages, max_tokens=2))
        async for _ in choices.first:
            pass
        return choices

    _, route = await gateway.run("g", RequestFacts(), RequestContext(), start)
    return route


async def test_one_gateway_finding_an_engine_down_spares_the_other_the_try(
    redis_server: Any, tmp_path: Path
) -> None:
    dead_runner, dead_url = await listen_loopback(engine_app(Script()))
    live_runner, live_url = await listen_loopback(engine_app(Script()))
    urls = {"dead": dead_url, "live": live_url}
    states = [SharedState(redis_server.url), SharedState(redis_server.url)]
    for s in states:
        await s.start()
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    clock = Clock()  # the boards' refresh clock: B's copy is as fresh as it may be
    pool_a, gw_a = _pool(tmp_path / "a", urls, states[0], clock)
    pool_b, gw_b = _pool(tmp_path / "b", urls, states[1], clock)
    try:
        for pool in (pool_a, pool_b):  # both have probed both engines: ready
            for name in urls:
                await pool.client_for(f"{name}/g")
        await dead_runner.cleanup()  # the engine dies; neither gateway's probe knows yet
        assert await _ask(pool_a, gw_a) == ["dead/g", "live/g"]  # A tries it and fails over
        assert pool_b.find("dead").state == "ready"  # B's own probe still says ready
        clock.now += 0.5  # B's local copy may be read again (at most every 0.5 s)
        assert await _ask(pool_b, gw_b) == ["live/g"]  # B never tries it
        status = {m["target"]: m["state"] for m in gw_b.groups.statuses()[0]["members"]}  # type: ignore[union-attr]
        assert status == {"dead/g": "unreachable", "live/g": "ready"}
    finally:
        await pool_a.close()
        await pool_b.close()
        await live_runner.cleanup()
        for s in states:
            await s.close()
