"""The shared buckets' admission and settle scripts against a real redis-server, on Redis's own
clock: what is admitted and charged (never how long anything took), the same verdict and
headers as the in-process buckets, and None (degraded) when Redis is gone."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from app.core.gateway.ratelimit import Limits, Tier, admit
from app.redis_state.connection import SharedState
from app.redis_state.limits import RedisBuckets

Body = Callable[[list[RedisBuckets]], Awaitable[None]]


def _run(url: str, body: Body, gateways: int = 1) -> None:
    async def go() -> None:
        states = [SharedState(url) for _ in range(gateways)]
        for s in states:
            await s.start()
        try:
            await body([RedisBuckets(s) for s in states])
        finally:
            for s in states:
                await s.close()

    asyncio.run(go())


async def _admitted(buckets: RedisBuckets, tiers: list[Tier], **kw: Any) -> bool:
    verdict = await buckets.admit(tiers, kw.pop("tokens", 0.0), **kw)
    assert verdict is not None
    return verdict.wait <= 0


def test_two_gateways_share_one_bucket_exactly(redis_server: Any) -> None:
    tier = [Tier("key:alice", 12, 0)]  # 12 rpm: a burst of 2, then one every 5 s

    async def body(gw: list[RedisBuckets]) -> None:
        results = [await _admitted(gw[i % 2], tier) for i in range(8)]
        assert results.count(True) == 2 and results[:2] == [True, True]

    _run(redis_server.url, body, gateways=2)


def test_a_refusal_charges_no_tier(redis_server: Any) -> None:
    key, everyone = Tier("key:bob", 0, 600), Tier("", 0, 60)  # 100 tokens, and 10 server-wide

    async def body(gw: list[RedisBuckets]) -> None:
        b = gw[0]
        assert await _admitted(b, [key, everyone], tokens=8.0)
        verdict = await b.admit([key, everyone], 8.0)
        assert verdict is not None and verdict.wait > 0 and verdict.limit == "tokens"
        level = await b.shared.aio.hget(b.shared.key("rl", "key:bob"), "tl")
        assert float(level) == 92.0  # written by the admission only: the refusal wrote nothing
        assert await b.shared.aio.pttl(b.shared.key("rl", "global")) > 0  # idle buckets expire

    _run(redis_server.url, body)


def test_a_tier_in_token_debt_refuses_until_settled_back(redis_server: Any) -> None:
    tier = [Tier("key:carol", 6000, 600)]

    async def body(gw: list[RedisBuckets]) -> None:
        b = gw[0]
        assert await _admitted(b, tier, tokens=50.0)
        assert await b.settle(tier, 400.0)  # it really used 450: a debt of 350
        verdict = await b.admit(tier, 0.0)
        assert verdict is not None and verdict.wait > 0 and verdict.limit == "tokens"
        assert await b.settle(tier, -400.0)  # refunded (at most to full)
        assert await _admitted(b, tier)

    _run(redis_server.url, body)


def test_headers_match_the_in_process_buckets(redis_server: Any) -> None:
    tier = Tier("key:dave", 60, 600)

    async def body(gw: list[RedisBuckets]) -> None:
        shared = await gw[0].admit([tier], 0.0)
        local = admit([Limits(60, 600, lambda: 0.0)], 0.0)
        assert shared is not None and shared.headers == local.headers
        assert shared.headers["x-ratelimit-remaining-requests"] == "9"

    _run(redis_server.url, body)


def test_scripts_are_loaded_again_after_a_flush(redis_server: Any) -> None:
    tier = [Tier("key:erin", 60, 0)]

    async def body(gw: list[RedisBuckets]) -> None:
        assert await _admitted(gw[0], tier)
        await gw[0].shared.aio.script_flush()  # EVALSHA now answers NOSCRIPT
        assert await _admitted(gw[0], tier)

    _run(redis_server.url, body)


def test_redis_gone_answers_none_and_degrades(redis_server: Any) -> None:
    async def body(gw: list[RedisBuckets]) -> None:
        redis_server.kill()
        assert await gw[0].admit([Tier("key:f", 60, 0)], 0.0) is None
        assert not await gw[0].settle([Tier("key:f", 0, 60)], 5.0)
        status = gw[0].shared.status()
        assert status["state"] == "degraded" and status["error"]

    _run(redis_server.url, body)
