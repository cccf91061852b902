"""Each group strategy's ordering: consistent hashing (a member leaving moves only its own
sessions), the prefix memory (longest prefix, bounded LRU), least-busy and round-robin."""

from __future__ import annotations

from app.core.gateway.groups import strategies
from app.core.gateway.groups.strategies import PrefixMemory, prefix_hashes, ring_order


def test_a_member_leaving_the_ring_moves_only_its_own_sessions() -> None:
    members = ["a/m", "b/m", "c/m"]
    sessions = [f"user-{i}" for i in range(600)]
    before = {s: ring_order(members, s)[0] for s in sessions}
    after = {s: ring_order(["a/m", "c/m"], s)[0] for s in sessions}
    moved = [s for s in sessions if before[s] != after[s]]
    assert moved and all(before[s] == "b/m" for s in moved)  # only b's users moved
    assert {after[s] for s in moved} == {"a/m", "c/m"}  # and they spread over the others
    # every member owns a fair share (virtual nodes): none under a sixth of 600
    assert all(list(before.values()).count(m) > 100 for m in members)


def test_the_ring_orders_every_member_once_and_is_stable() -> None:
    order = ring_order(["a/m", "b/m", "c/m"], "alice")
    assert sorted(order) == ["a/m", "b/m", "c/m"]
    assert ring_order(["c/m", "a/m", "b/m"], "alice") == order  # the list's order is irrelevant
    assert ring_order([], "alice") == []


def test_prefix_hashes_share_their_leading_blocks() -> None:
    system = "You are a careful assistant. " * 20
    first = prefix_hashes(system + "\nWhat is 2+2?", 256)
    follow = prefix_hashes(system + "\nWhat is 2+2?\n4\nAnd 3+3?", 256)
    assert first and follow[: len(first)] == first
    assert len(prefix_hashes("x" * 10_000, 256)) == 256 // strategies.BLOCK_TOKENS  # bounded
    assert prefix_hashes("short", 256) == []  # under one block: nothing to remember


def test_prefix_memory_finds_the_longest_known_prefix_and_forgets_the_oldest() -> None:
    mem = PrefixMemory(size=4)
    mem.remember([1, 2], "a/m")
    mem.remember([1, 2, 3], "b/m")  # a longer conversation served by b
    assert mem.lookup([1, 2, 3, 9]) == "b/m"
    assert mem.lookup([1, 7]) == "b/m"  # block 1 was last served by b
    assert mem.lookup([5]) is None
    mem.remember([10, 11], "c/m")  # over the bound: the least recently used go
    assert len(mem) == 4
    assert mem.lookup([10, 11]) == "c/m"


def test_least_busy_orders_by_in_flight_then_recent_errors_then_member_order() -> None:
    members = ["a/m", "b/m", "c/m", "d/m"]
    flight = {"a/m": 2, "b/m": 0, "c/m": 0, "d/m": 0}
    errors = {"b/m": 3, "c/m": 0, "d/m": 0}
    got = strategies.least_busy(members, flight.__getitem__, lambda m: errors.get(m, 0))
    assert got == ["c/m", "d/m", "b/m", "a/m"]


def test_round_robin_starts_one_member_further_each_turn() -> None:
    members = ["a/m", "b/m", "c/m"]
    firsts = [strategies.rotated(members, t)[0] for t in range(6)]
    assert firsts == ["a/m", "b/m", "c/m", "a/m", "b/m", "c/m"]
    assert strategies.rotated(members, 1) == ["b/m", "c/m", "a/m"]


def test_a_prefix_replica_is_overloaded_only_far_above_the_least_busy() -> None:
    assert not strategies.overloaded(8, 0)  # within the absolute bound
    assert strategies.overloaded(9, 0)
    assert not strategies.overloaded(30, 20)  # far in count, not in ratio
    assert strategies.overloaded(41, 20)
