"""How a group orders its healthy members for one request.

``least-busy``: fewest requests in flight from this gateway, ties by fewest recent errors, then
member order. ``round-robin``: each request starts one member further. ``session``: a
consistent-hash ring with virtual nodes over the healthy members, so a session stays on its
replica while that one is healthy and a member leaving moves only its own sessions.
``prefix``: the conversation's leading text hashed in blocks; the member that served the
longest known prefix first (its prompt cache holds it), an unseen prefix least-busy, and so
does a known one while its replica is far busier than the least busy member (``overloaded``).
Tested by tests/core/gateway/groups/test_strategies.py."""

from __future__ import annotations

import bisect
import hashlib
from collections import OrderedDict
from collections.abc import Callable, Sequence

VNODES = 64  # points per member on the ring: an even share without a large ring
CHARS_PER_TOKEN = 4  # the prompt's tokens before a tokenizer is chosen (as ``auto`` counts)
BLOCK_TOKENS = 16  # a prefix is remembered in blocks of this many tokens
PREFIX_MEMORY = 4096  # prefixes remembered per group (least recently used dropped)
# a prefix's replica is passed over while it is this much busier than the least busy member
# (both bounds must hold): conversations sharing one long system prompt would otherwise all
# pile onto the replica that served it first
SPILL_ABS = 8  # requests in flight more than the least busy
SPILL_REL = 2.0  # and more than this many times its count


def _h(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8", "replace"), digest_size=8).digest())


def least_busy(
    members: Sequence[str], in_flight: Callable[[str], int], errors: Callable[[str], int]
) -> list[str]:
    """``members`` by requests in flight, then recent errors, then their order."""
    return sorted(members, key=lambda m: (in_flight(m), errors(m), members.index(m)))


def overloaded(preferred: int, least: int) -> bool:
    """Whether a prefix's replica with ``preferred`` requests in flight is too busy to keep
    its conversations, beside a member with ``least`` (see SPILL_ABS, SPILL_REL)."""
    return preferred - least > SPILL_ABS and preferred > SPILL_REL * least


def rotated(members: Sequence[str], turn: int) -> list[str]:
    """``members`` starting at ``turn`` (modulo their count), in order after it."""
    if not members:
        return []
    k = turn % len(members)
    return [*members[k:], *members[:k]]


def ring_order(members: Sequence[str], key: str) -> list[str]:
    """``members`` in the order a consistent-hash ring meets them from ``key``'s point: the
    first owns the key; removing a member changes the owner only of the keys it owned."""
    if not members:
        return []
    points = sorted((_h(f"{m}#{i}"), m) for m in members for i in range(VNODES))
    hashes = [p for p, _ in points]
    start = bisect.bisect(hashes, _h(key)) % len(points)
    out: list[str] = []
    for i in range(len(points)):
        m = points[(start + i) % len(points)][1]
        if m not in out:
            out.append(m)
            if len(out) == len(members):
                break
    return out


def prefix_hashes(text: str, max_tokens: int) -> list[int]:
    """The cumulative hashes of ``text``'s leading blocks (``BLOCK_TOKENS`` tokens each, at most
    ``max_tokens``): equal leading text, equal hashes; a longer prefix, more of them."""
    block = BLOCK_TOKENS * CHARS_PER_TOKEN
    lead = text[: max_tokens * CHARS_PER_TOKEN]
    out: list[int] = []
    h = hashlib.blake2b(digest_size=8)
    for end in range(block, len(lead) + 1, block):
        h.update(lead[end - block : end].encode("utf-8", "replace"))
        out.append(int.from_bytes(h.copy().digest()))
    return out


class PrefixMemory:
    """Which member served which prefix: a bounded LRU of prefix hash -> member."""

    def __init__(self, size: int = PREFIX_MEMORY) -> None:
        self._size = size
        self._lru: OrderedDict[int, str] = OrderedDict()

    def lookup(self, hashes: Sequence[int]) -> str | None:
        """The member that served the longest of these prefixes, or None."""
        for h in reversed(hashes):
            m = self._lru.get(h)
            if m is not None:
                self._lru.move_to_end(h)
                return m
        return None

    def remember(self, hashes: Sequence[int], member: str) -> None:
        for h in hashes:
            self._lru[h] = member
            self._lru.move_to_end(h)
        while len(self._lru) > self._size:
            self._lru.popitem(last=False)

    def __len__(self) -> int:
        return len(self._lru)
