"""A group's routing over a real provider pool and gateway (engines scripted at the client
seam, as tests/core/gateway/providers/test_pool.py does; real engines: tests/e2e/providers/
test_replica_groups.py): healthy members first and open ones skipped, a half-open member's
single trial, least-busy counts, round-robin turns taken only by a request, session and prefix
affinity, what a failed upstream call does to the circuit, and the active checks' answers."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from app.core.gateway.auto import RequestFacts
from app.core.gateway.cache.replay import ResponseCache
from app.core.gateway.cache.store import CacheConfig, CacheStore
from app.core.gateway.facts import chat_facts
from app.core.gateway.groups.router import GroupRouter, default_health_path
from app.core.gateway.groups.store import GroupConfig, GroupStore
from app.core.gateway.providers.base import Answer, Probe, RemoteModel
from app.core.gateway.providers.pool import ProviderPool
from app.core.gateway.providers.store import ProviderConfig, ProviderStore
from app.core.gateway.resolve import Gateway, Routing
from app.core.inference.generation import Choices, Generation
from app.core.requests import ChatRequest, RequestContext
from app.core.types import ChatMessage, Delta, SamplingParams, Usage
from app.errors import InvalidRequest, ProviderError, ProviderTimeout, ProviderUnavailable


class Engine:
    """A client whose probe answers ready with model ``m`` and whose health check answers
    ``health`` (the test sets it)."""

    def __init__(self, cfg: ProviderConfig, key: str | None) -> None:
        self.cfg = cfg
        self.health = 200
        self.checks = 0

    async def probe(self, *, detect: bool = False) -> Probe:
        return Probe("ready", (RemoteModel("m"), RemoteModel("g")), 1.0)

    async def check(self, path: str, timeout: float) -> Answer:
        self.checks += 1
        return Answer(self.health, None)

    async def close(self) -> None:
        pass

    async def close_when_idle(self) -> None:
        pass


NAMES = ("p1", "p2", "p3")


@pytest.fixture
def parts(tmp_path: Path) -> Any:
    store = ProviderStore(tmp_path / "providers.json", tmp_path / "keys.json")
    for n in NAMES:
        store.add(ProviderConfig(n, f"http://{n}:8000/v1", kind="vllm"), None, lambda p: None)
    pool = ProviderPool(store, Engine)  # type: ignore[arg-type]
    groups = GroupStore(tmp_path / "groups.json")
    router = GroupRouter(groups, pool)
    gateway = Gateway(None, Routing, pool.is_target, lambda m: False, router)
    return pool, groups, router, gateway


def _group(router: GroupRouter, **kw: Any) -> None:
    router.set(GroupConfig("g", ("p1/m", "p2/m", "p3/m"), **kw))


async def test_open_members_are_skipped_while_a_healthy_one_exists(parts: Any) -> None:
    pool, groups, router, gateway = parts
    _group(router, failures_to_open=1)
    assert gateway.targets("g", RequestFacts()) == ["p1/m", "p2/m", "p3/m"]
    pool.record("p1/m", ProviderError("boom", provider="p1", status=502))
    pool.record("p2/m", ProviderTimeout("slow", provider="p2"))
    assert gateway.targets("g", RequestFacts()) == ["p3/m"]
    pool.record("p3/m", ProviderUnavailable("refused", provider="p3"))
    # none healthy: every member, still in the strategy's order, rather than nothing
    assert sorted(gateway.targets("g", RequestFacts())) == ["p1/m", "p2/m", "p3/m"]
    states = {m["target"]: m["state"] for m in router.statuses()[0]["members"]}
    assert states == {"p1/m": "open", "p2/m": "open", "p3/m": "unreachable"}
    await pool.close()


async def test_a_half_open_member_gets_one_request_then_its_success_closes_it(parts: Any) -> None:
    pool, groups, router, gateway = parts
    _group(router, failures_to_open=1, cooldown_s=0.5)
    pool.record("p1/m", ProviderError("boom", provider="p1", status=500))
    clock = pool.circuits._clock
    pool.circuits._clock = lambda: clock() + 1.0  # the cool-down has passed
    assert router.statuses()[0]["members"][0]["state"] == "half-open"
    assert "p1/m" in gateway.targets("g", RequestFacts(), commit=True)  # the trial
    assert "p1/m" not in gateway.targets("g", RequestFacts(), commit=True)  # nobody else
    pool.record("p1/m", None)  # the trial started: closed
    assert router.statuses()[0]["members"][0]["state"] == "ready"
    assert "p1/m" in gateway.targets("g", RequestFacts(), commit=True)
    await pool.close()


async def test_least_busy_prefers_fewer_requests_in_flight(parts: Any) -> None:
    pool, _, router, gateway = parts
    _group(router)
    pool.in_flight.add("p1/m")
    pool.in_flight.add("p2/m")
    pool.in_flight.add("p2/m")
    assert gateway.targets("g", RequestFacts()) == ["p3/m", "p1/m", "p2/m"]
    await pool.close()


async def test_round_robin_turns_are_taken_by_requests_not_by_looking(parts: Any) -> None:
    pool, _, router, gateway = parts
    _group(router, strategy="round-robin")
    assert gateway.targets("g", RequestFacts())[0] == "p1/m"
    assert gateway.targets("g", RequestFacts())[0] == "p1/m"  # a look takes no turn
    firsts = [gateway.targets("g", RequestFacts(), commit=True)[0] for _ in range(4)]
    assert firsts == ["p1/m", "p2/m", "p3/m", "p1/m"]
    await pool.close()


async def test_a_session_stays_on_its_replica_until_that_one_opens(parts: Any) -> None:
    pool, _, router, gateway = parts
    _group(router, strategy="session", failures_to_open=1)
    homes = {s: gateway.targets("g", RequestFacts(), None, s)[0] for s in ("a", "b", "c", "d")}
    again = {s: gateway.targets("g", RequestFacts(), None, s)[0] for s in homes}
    assert again == homes
    victim = homes["a"]
    pool.record(victim, ProviderError("boom", provider=victim.split("/")[0], status=503))
    moved = {s: gateway.targets("g", RequestFacts(), None, s)[0] for s in homes}
    assert moved["a"] != victim
    assert all(moved[s] == homes[s] for s in homes if homes[s] != victim)
    await pool.close()


async def test_prefix_sends_a_follow_up_turn_to_the_replica_that_served_the_first(
    parts: Any,
) -> None:
    pool, _, router, gateway = parts
    _group(router, strategy="prefix")
    first = "system: " + "be brief and exact. " * 30 + "\nuser: what is 2+2?"
    answered: list[str] = []

    async def start(target: str) -> str:
        answered.append(target)
        return target

    pool.in_flight.add("p1/m")  # least-busy would not pick p1 for an unseen prefix
    served, _ = await gateway.run("g", RequestFacts(text=first), RequestContext(), start)
    assert served != "p1/m"
    pool.in_flight.add(served)  # busier now: least-busy alone would move on
    follow = first + "\nassistant: 4\nuser: and 3+3?"
    again, _ = await gateway.run("g", RequestFacts(text=follow), RequestContext(), start)
    assert again == served
    other, _ = await gateway.run("g", RequestFacts(text="x" * 400), RequestContext(), start)
    assert other != served  # an unseen prefix goes least-busy
    # a conversation first answered by a member named directly: the group remembers it too
    direct = "y" * 400
    await gateway.run("p1/m", RequestFacts(text=direct), RequestContext(), start)
    again, _ = await gateway.run("g", RequestFacts(text=direct + "more"), RequestContext(), start)
    assert again == "p1/m"  # though p1 is busier
    await pool.close()


async def test_prefix_spills_to_the_least_busy_while_its_replica_is_far_busier(
    parts: Any,
) -> None:
    pool, _, router, gateway = parts
    _group(router, strategy="prefix")
    system = "system: " + "you are a careful assistant. " * 40

    async def start(target: str) -> str:
        return target

    served, _ = await gateway.run("g", RequestFacts(text=system + "q1"), RequestContext(), start)
    for _ in range(8):  # busier, but within the spill bounds: the prefix still wins
        pool.in_flight.add(served)
    again, _ = await gateway.run("g", RequestFacts(text=system + "q2"), RequestContext(), start)
    assert again == served
    pool.in_flight.add(served)  # 9 more than an idle member: its conversations spill over
    spilled, _ = await gateway.run("g", RequestFacts(text=system + "q3"), RequestContext(), start)
    assert spilled != served
    await pool.close()


async def test_retry_after_cools_the_member_down_without_opening_it(parts: Any) -> None:
    pool, groups, router, gateway = parts
    _group(router, failures_to_open=1)
    err = ProviderError("busy", provider="p1", status=429, upstream_retry_after=30)
    pool.record("p1/m", err)
    assert gateway.targets("g", RequestFacts()) == ["p2/m", "p3/m"]
    assert router.statuses()[0]["members"][0]["state"] == "cooling"
    assert pool.circuits.recent_errors("p1") == 0
    await pool.close()


async def test_active_checks_open_a_failing_member_and_close_a_recovered_one(
    parts: Any,
) -> None:
    pool, groups, router, gateway = parts
    _group(router, failures_to_open=2, health_interval_s=0.5)
    gateway.targets("g", RequestFacts())  # starts the checks
    engine = pool.find("p2").client
    engine.health = 503
    for _ in range(2000):
        if pool.circuits.state("p2") == "open":
            break
        await asyncio.sleep(0.005)
    assert pool.circuits.state("p2") == "open"
    assert gateway.targets("g", RequestFacts()) == ["p1/m", "p3/m"]
    router.checked("p2", 200, None, "/health")  # open: the cool-down is waited out first
    assert pool.circuits.state("p2") == "open"
    await router.close()
    await pool.close()


async def test_members_must_name_providers_and_names_may_not_shadow_a_prefix(parts: Any) -> None:
    pool, _, router, _ = parts
    with pytest.raises(InvalidRequest, match="neither a provider"):
        router.set(GroupConfig("g", ("p1/m", "nope")))
    with pytest.raises(InvalidRequest, match="prefix 'p1/'"):
        router.set(GroupConfig("p1/x", ("p2/m",)))
    saved = router.set(GroupConfig("qwen", ("p1", "p2")))
    assert router.members(saved) == ["p1/qwen", "p2/qwen"]
    assert router.visible(("p1/*",)) == {}  # the group's own name is out of that scope
    assert router.visible(("qwen", "p1/*")) == {"qwen": ["p1/qwen"]}
    await pool.close()


async def test_listing_the_groups_starts_the_active_checks(parts: Any) -> None:
    pool, _, router, _ = parts
    _group(router, health_interval_s=0.5)
    router.statuses()  # as the server does when it starts: no request needed
    engine = pool.find("p3").client
    for _ in range(2000):
        if engine.checks:
            break
        await asyncio.sleep(0.005)
    assert engine.checks >= 1
    await router.close()
    await pool.close()


def test_the_health_path_by_kind() -> None:
    assert default_health_path("vllm") == "/health"
    assert default_health_path("ollama") == "/v1/models"


class _Answer:
    """A started generation that says "Four." and ends."""

    prompt_tokens = 3

    def __aiter__(self) -> Any:
        return self._deltas()

    async def _deltas(self) -> Any:
        yield Delta("Four.", 2)
        yield Delta(finish_reason="stop", usage=Usage(3, 2))

    def cancel(self) -> None:
        pass


async def test_the_response_cache_keys_a_group_by_its_members_not_by_this_moments_order(
    parts: Any, tmp_path: Path
) -> None:
    pool, _, router, gateway = parts
    _group(router)
    cache = ResponseCache(CacheStore(tmp_path / "cache.db"), lambda: CacheConfig(mode="exact"))
    req = ChatRequest("g", (ChatMessage("user", "2+2?"),), SamplingParams(temperature=0.0))
    started: list[str] = []

    async def start(r: ChatRequest) -> Choices:
        started.append(r.model)
        return Choices([Generation(r.model, 3, _Answer())])

    first = await cache.serve(req, chat_facts(req), gateway, start)
    async for _ in first.first:
        pass
    pool.in_flight.add("p1/m")  # least-busy now orders the members otherwise
    second = await cache.serve(req, chat_facts(req), gateway, start)
    assert second.cache == "hit" and started == ["p1/m"]
    await pool.close()
