"""Which tokens each sequence slot of a llama.cpp context holds in its KV cache, and how a new
prompt reuses them (the prompt cache). Worker thread only.

A slot is a llama.cpp sequence id. Each remembers the tokens its cells hold (prompt and
generated answer). "reuse" continues a prompt from the whole prefix it shares with a slot; a
common prefix can also be given to another slot, so several conversations keep their caches: in
a shared (unified) cache by sharing its cells (counted once), with a stream per sequence by
copying the stream when the prefix is long enough to be worth it (``stream_copy_min``).
"exact" also counts how many tokens were computed as whole micro-batches aligned at multiples
of n_ubatch, the way a fresh run computes a prompt, and reuses only those: the rest is computed
in the same batches as a fresh run would, so the output is bit-identical to an uncached run.
"off" keeps nothing.

In a shared cache every step's attention walks all used cells, idle conversations' included,
so a "reuse" shared cache moves idle caches to host memory (llama.cpp's sequence state) while
other sequences run, and restores one when a prompt continues it further than any cache in
place, within a byte bound that the memory estimate counts (``fit.prompt_ram``). A copy costs
a copy per layer and V row for each range of cells that lie together, so a cache in few ranges
leaves as another sequence starts (``stash_idle``); a scattered one (streams decoded together)
stays until the attention it has cost others adds up to what its copy costs (``charge``):
renting until the rent reaches the price costs at most twice the better choice. An earlier
answer to a question asked again is dropped when it lies scattered, copied when not (``take``).
docs/runtime.md ("Idle caches move to host memory" and the items after it) has the numbers.
Tested by tests/runtimes/llama/test_mixed_batch.py.
"""

from __future__ import annotations

import ctypes
import math
import mmap
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from app.core.library.fit import STASH_CAP
from app.runtimes.llama.backend import L
from app.runtimes.worker import common_prefix

# a host copy holding this many tokens more than a prompt shares with it (another answer to the
# same question) is kept when the prompt's part is restored; with fewer, the copy is the prompt's
KEEP_TAIL_MIN = 16
# With a stream per sequence, a common prefix is copied into another slot's stream (llama.cpp
# copies the whole stream's buffer) when computing it again would cost more: measured on 2 Xeon
# cores with SmolLM2 (f16 cache), a 2,048-cell stream (47 MB) copied in ~7 ms and a 4,096-cell
# one in ~15 ms, while a prompt token took ~2.8 ms (270 MFLOP): a byte copied costs what ~14
# FLOP of a prompt's compute do. Twice the break-even, for machines whose ratio differs.
COPY_FLOP_PER_BYTE = 14.0
COPY_MARGIN = 2.0
# llama.cpp's attention span is the used cells rounded up to this: below it, idle cells cost none
KV_PAD = 256
# a cache in at most this many ranges is a cheap copy: it leaves when another sequence starts,
# and an earlier answer to a question asked again is kept (in more, it is dropped)
REGEN_KEEP_RANGES = 16


# A copy's cost against an idle cell's, measured on 2 Xeon cores with SmolLM2 (n_embd 576; K
# and V rows of 192): one query token attending one more cell took ~2 us a step (1.6 in a batch
# of 8, 3.1 alone); a copy ~0.17 ms a range with the V cache transposed (193 rows a layer to
# copy per range) and ~11 us a cell. Per range and per cell, in units of that attention, scaled
# to other models by the rows a range copies (or the bytes a cell holds) against n_embd (the
# attention's work per cell).
RANGE_COST = 254.0  # 85 x 576 / 193
CELL_COST = 8.25  # 5.5 x 576 / 384


def _kv_row(model: Any) -> tuple[int, int]:
    """(n_embd, the elements of a cell's K (or V) in one layer) of a llama_model pointer."""
    n_embd = max(1, int(L.llama_model_n_embd(model)))
    n_head = max(1, int(L.llama_model_n_head(model)))
    return n_embd, n_embd // n_head * max(1, int(L.llama_model_n_head_kv(model)))


def copy_costs(model: Any, *, v_transposed: bool) -> dict[str, float]:
    """``Slots``' range_cost and cell_cost for ``model`` (a llama_model pointer)."""
    n_embd, row = _kv_row(model)
    rows = 1 + (row if v_transposed else 1)  # a layer's copies per range: K, then V
    return {"range_cost": RANGE_COST * rows / n_embd, "cell_cost": CELL_COST * 2 * row / n_embd}


def stream_copy_min(model: Any, stream_cells: int, elem_bytes: float) -> int:
    """The shortest common prefix worth copying from one cache stream of ``stream_cells``
    cells (``elem_bytes`` a K or V element) to another, rather than computed again: with
    SmolLM2, 5 tokens for a 2,048-cell stream, 10 for 4,096."""
    _, row = _kv_row(model)
    stream_bytes = stream_cells * int(L.llama_model_n_layer(model)) * 2 * row * elem_bytes
    token_flop = 2 * max(1, int(L.llama_model_n_params(model)))
    return max(1, math.ceil(COPY_MARGIN * stream_bytes * COPY_FLOP_PER_BYTE / token_flop))


@dataclass(slots=True)
class _Stashed:
    """An idle cache in host memory: the tokens its cells held and llama.cpp's state of them."""

    tokens: list[int]
    data: mmap.mmap  # its own anonymous mapping: dropped, its memory goes back to the system
    size: int
    last_used: float


def _bytes(m: mmap.mmap) -> Any:
    """A ctypes view of ``m`` for llama.cpp (deleted before ``m`` closes)."""
    return (ctypes.c_uint8 * len(m)).from_buffer(m)


@dataclass(frozen=True, slots=True)
class CacheShape:
    """The KV cache the slots share: its prompt-cache ``mode``, whether it is one unified cache
    (``shared``: cells can be shared between slots), the batch alignment and the SWA window."""

    mode: str
    shared: bool
    align: int
    n_swa: int


@dataclass(frozen=True, slots=True)
class CopyCosts:
    """A cell copy's cost per range and per cell, in units of one query token attending one
    cell, and (a stream per sequence) the shortest common prefix worth copying."""

    range_cost: float = 0.0
    cell_cost: float = 0.0
    copy_min: int = 1


class Slots:
    def __init__(
        self,
        mem: Any,
        n_slots: int,
        shape: CacheShape,
        *,
        ctx: Any = None,
        cells: int = 0,
        costs: CopyCosts | None = None,
    ) -> None:
        costs = costs or CopyCosts()
        mode, shared, align, n_swa = shape.mode, shape.shared, shape.align, shape.n_swa
        range_cost, cell_cost, copy_min = costs.range_cost, costs.cell_cost, costs.copy_min
        self.mem = mem
        self.copy_min = copy_min  # with a stream per sequence: a prefix worth copying
        # a copy's cost per range and per cell, in units of one query token attending one cell
        # (what an idle cell in place costs a step, per token it decodes or reads)
        self.range_cost = range_cost
        self.cell_cost = cell_cost
        self.ctx = ctx
        # idle caches go to host memory only from a shared "reuse" cache, up to as many bytes as
        # the cache's ``cells`` take (at most STASH_CAP)
        self.stash_cells = cells if shared and mode == "reuse" and ctx is not None else 0
        self.stashed: list[_Stashed] = []
        self.stashed_bytes = 0
        self.stash_limit = 0  # bytes, known from the first copy
        self.restores = 0  # caches brought back from host memory so far
        self.mode = mode
        self.shared = shared  # one unified cache: cells can be shared between slots
        self.align = align
        self.n_swa = n_swa
        self.kv: list[list[int]] = [[] for _ in range(n_slots)]
        # where each slot's cell ranges begin (positions), as its tokens were placed: a piece
        # placed right after the same slot's last one continues its range
        self.starts: list[list[int]] = [[] for _ in range(n_slots)]
        self._last_placed = -1
        # when each slot's own cells were placed: (first, last) of a count of placements.
        # Slots decoded in the same steps overlap: their cells lie interleaved
        self.placed: list[tuple[int, int] | None] = [None] * n_slots
        self._placements = 0
        self.prompt_len = [0] * n_slots  # its last request's prompt; the rest is its answer
        self.rent = [0.0] * n_slots  # what an idle cache in place has cost others' attention
        # an idle cache's cells that no running sequence shares (known while they run)
        self._own: dict[int, int] | None = None
        self._cells = 0  # the cells in use, about (counted when ``_own`` is)
        self.free = list(range(n_slots))
        self._exact = [0] * n_slots
        self._last_used = [0.0] * n_slots
        # until when (time.monotonic) an interactive request's cache stays in place as others
        # start (``release``'s ``warm``): an editor's next keystroke continues its prompt
        self.warm_until = [0.0] * n_slots

    def _changed(self) -> None:
        self._own = None

    def _warm(self, slot: int, now: float) -> bool:
        """Whether ``slot``'s idle cache is still warm (``release``) at ``now``."""
        return self.warm_until[slot] > now

    def busy(self) -> int:
        """Slots taken by running (or parked) sequences."""
        return len(self.kv) - len(self.free)

    def take(self, tokens: list[int], *, cool: bool = False) -> int:
        """A free slot for ``tokens``: the one whose cache shares the longest prefix with them.
        When that cache also holds more (another conversation's turn), the common prefix goes
        to an empty or the least recently used slot instead, so the other conversation keeps
        its cache. ``cool``: an editor's request (interactive), the last one from here on: a
        cache kept warm for one before (``release``) that it shares less than half of cools
        (another file's whole cache in the attention's way slowed back-to-back infills). One it
        mostly continues stays warm: moved now, its shared cells would be copied too."""
        slot = self._take(tokens)
        if cool:  # the warm ones only: common_prefix walks the tokens in Python
            for sl in self.free:
                if self.warm_until[sl] and 2 * common_prefix(self.kv[sl], tokens) < len(
                    self.kv[sl]
                ):
                    self.warm_until[sl] = 0.0
        return slot

    def longest(self, tokens: list[int], among: Iterable[int] | None = None) -> tuple[int, int]:
        """The slot whose cache shares the longest prefix with ``tokens`` (the shorter cache on
        a tie), and that prefix's length: of ``among`` (the worker's), or of all slots, each
        read as one copy (the event loop asks while the worker moves them). Read-only."""
        best, most, size = -1, -1, 0
        for sl in range(len(self.kv)) if among is None else among:
            kv = self.kv[sl] if among is not None else self.kv[sl][:]
            n = common_prefix(kv, tokens)
            if n > most or n == most and len(kv) < size:
                best, most, size = sl, n, len(kv)
        return best, most

    def _take(self, tokens: list[int]) -> int:
        self._changed()
        free, kv = self.free, self.kv
        best, common = self.longest(tokens, free)
        restored = self._restore_for(tokens, min(common, len(tokens) - 1))
        if restored is not None:
            free.remove(restored)
            return restored
        slot = best
        if self.mode == "reuse" and len(free) > 1:
            common = common_prefix(kv[best], tokens)  # (best may have left during a restore)
            shared = min(common, len(tokens) - 1)
            # the prompt asks best's question again: best holds another answer to it
            again = self.shared and 0 < self.prompt_len[best] <= common
            if shared < len(kv[best]) and self._elsewhere(best, shared, again, len(tokens)):
                slot = min(
                    (sl for sl in free if sl != best),
                    key=lambda sl: (bool(kv[sl]), self._last_used[sl]),
                )
                self.forget(slot)
                if shared > 0 and not self._breaks_swa(best, shared):
                    self._give_prefix(best, slot, shared)
                if again:
                    # the earlier answer is kept (it lies together, a cheap copy): to host
                    # memory now, so the question's last token and the new answer go into the
                    # cells the first run used (the same greedy answer however often it is
                    # asked)
                    self.stash(best)
        free.remove(slot)
        return slot

    def _elsewhere(self, best: int, shared: int, again: bool, n_prompt: int) -> bool:
        """Whether a prompt of ``n_prompt`` tokens sharing ``shared`` with slot ``best`` (which
        holds more) goes to another slot. In a shared cache yes (its spare slots keep idle
        caches), unless it asks ``best``'s question ``again`` and ``best``'s answer lies
        scattered: that answer is dropped rather than copied to host memory
        (``REGEN_KEEP_RANGES``). With a stream per sequence, each slot is one conversation's
        cache: to an empty stream if one is free; else only when the prompt parts from ``best``
        early (another conversation: the least recently used one gives up its stream). A prompt
        wholly in ``best`` (a regenerated answer) or keeping most of it (its own follow-up)
        stays."""
        if self.shared:
            return not again or self.ranges(best, self.prompt_len[best]) <= REGEN_KEEP_RANGES
        if any(not self.kv[sl] for sl in self.free if sl != best):
            return True
        return shared < n_prompt - 1 and shared * 2 < len(self.kv[best])

    def _give_prefix(self, src: int, dst: int, n: int) -> None:
        """Slot ``dst`` (empty) starts with the first ``n`` cached tokens of ``src``."""
        if self.shared:
            L.llama_memory_seq_cp(self.mem, src, dst, 0, n)
        elif n >= self.copy_min:
            # across streams llama.cpp copies a whole stream (at the next decode); then the
            # copy's tail is dropped
            L.llama_memory_seq_cp(self.mem, src, dst, -1, -1)
            if not L.llama_memory_seq_rm(self.mem, dst, n, -1):
                L.llama_memory_seq_rm(self.mem, dst, -1, -1)
                return
        else:
            return
        self.kv[dst] = self.kv[src][:n]
        self.starts[dst] = [p for p in self.starts[src] if p < n]
        self.placed[dst] = None  # its cells are src's; its own come later
        self.prompt_len[dst] = 0

    def share_prefix(self, src: int, dst: int, n: int) -> int:
        """Slot ``dst`` starts over from the first ``n`` cached tokens of ``src`` (a scored
        list's prompts read their shared prefix once), when a copy is worth it and the model's
        sliding window allows it; returns the tokens ``dst`` holds then."""
        if self._breaks_swa(src, n) or (not self.shared and n < self.copy_min):
            return len(self.kv[dst])
        self.forget(dst)
        self._give_prefix(src, dst, n)
        return len(self.kv[dst])

    def borrow(self, slot: int, tokens: list[int], have: int) -> int:
        """In one shared "reuse" cache, the cells another slot holds for a longer prefix of
        ``tokens`` than ``slot`` has (``have``) become ``slot``'s too, running or not: they
        gain a sequence, nothing is read or copied. Prompts that come together with a common
        prefix (an editor's keystrokes, one agent's parallel calls) read it once, each
        continuing where another got to. Returns the tokens ``slot`` holds then."""
        if not self.shared or self.mode != "reuse" or have >= len(tokens) - 1:
            return have
        kv, nxt = self.kv, tokens[have]
        # a quick look first: only a slot holding the next token there can hold more
        others = [
            sl for sl in range(len(kv)) if sl != slot and len(kv[sl]) > have and kv[sl][have] == nxt
        ]
        src, most = self.longest(tokens, others) if others else (slot, have)
        most = min(most, len(tokens) - 1)  # the last token is read: its logits are needed
        if src == slot or most <= have:
            return have
        held = self.share_prefix(src, slot, most)  # have, where the window forbids it
        self.prompt_len[slot] = len(tokens)
        return held

    def _breaks_swa(self, slot: int, keep: int) -> bool:
        """Sliding-window layers forget old positions: continuing at ``keep`` needs the last
        n_swa of them (llama-server's rule)."""
        return self.n_swa > 0 and L.llama_memory_seq_pos_min(self.mem, slot) > max(
            0, keep - self.n_swa
        )

    def reuse(self, slot: int, tokens: list[int]) -> int:
        """Keep the slot's cache for the prefix it shares with ``tokens`` (never the last token:
        its logits are needed; in exact mode only whole aligned micro-batches); drop the rest.
        Returns the kept length."""
        kv = self.kv[slot]
        keep = 0
        if self.mode != "off":
            keep = min(common_prefix(kv, tokens), len(tokens) - 1)
            if self.mode == "exact":
                keep = min(keep, self._exact[slot])
                keep -= keep % self.align
        if keep > 0 and self._breaks_swa(slot, keep):
            keep = 0
        if keep > 0 and not L.llama_memory_seq_rm(self.mem, slot, keep, -1):
            keep = 0  # this memory cannot drop a tail (recurrent models): start over
        if keep == 0:
            L.llama_memory_seq_rm(self.mem, slot, -1, -1)
            self.placed[slot] = None
        del kv[keep:]
        self.starts[slot] = [p for p in self.starts[slot] if p < keep]
        self.prompt_len[slot] = len(tokens)
        self._exact[slot] = keep
        return keep

    def append(self, slot: int, tokens: list[int]) -> None:
        """``tokens`` were placed in the cache for ``slot`` (one decode)."""
        if self._last_placed != slot or not self.starts[slot]:
            self.starts[slot].append(len(self.kv[slot]))
        self._last_placed = slot
        self.kv[slot].extend(tokens)
        self._placements += 1
        first = self.placed[slot]
        self.placed[slot] = (self._placements if first is None else first[0], self._placements)

    def take_back(self, slot: int, n: int) -> None:
        """The last ``n`` tokens placed for ``slot`` left the cache (a stopped decode)."""
        del self.kv[slot][len(self.kv[slot]) - n :]
        while self.starts[slot] and self.starts[slot][-1] >= len(self.kv[slot]):
            self.starts[slot].pop()

    def ranges(self, slot: int, start: int = 0) -> int:
        """How many ranges the slot's cells from position ``start`` on lie in (at most)."""
        if len(self.kv[slot]) <= start:
            return 0
        return 1 + sum(1 for p in self.starts[slot] if p > start)

    def copy_cost(self, slot: int) -> float:
        """What copying the slot's cache to host memory costs, in attention units."""
        return self.range_cost * self.ranges(slot) + self.cell_cost * len(self.kv[slot])

    def charge(self, queries: int) -> None:
        """``queries`` tokens were just decoded or read, each attending every used cell: the
        idle caches in place pay for theirs, and one whose bill reaches its copy's cost goes to
        host memory. Nothing is charged while all the cells lie within llama.cpp's padding of
        the attention span (there they cost nothing). At most one leaves a step: the running
        streams wait for each copy (~30 ms for a 165-token answer from a batch of 8), so caches
        that come due together (a batch's answers) leave one step apart, not in one stall.
        A warm cache (``release``) stays until it is cold, its bill running on meanwhile."""
        if self._own is None:  # the running sequences changed
            self._own = self._own_cells()
            self._cells = self._in_use()
        self._cells += queries  # they are cells now
        if not self._own or self._cells <= KV_PAD:
            return
        due: list[tuple[float, int]] = []
        now = time.monotonic()
        for slot, own in self._own.items():
            self.rent[slot] += queries * own
            if (over := self.rent[slot] / max(self.copy_cost(slot), 1.0)) >= 1.0:
                if not self._warm(slot, now):  # a warm one pays on, and leaves once cold
                    due.append((over, slot))
        # one copy a step, the most overdue first (one that cannot be kept in host memory stays
        # and lets the next go)
        for _, slot in sorted(due, reverse=True):
            if self.stash(slot):
                break

    def computed_whole(self, slot: int, n_tokens: int) -> None:
        """A prompt of ``n_tokens`` was read from the start of a micro-batch: its whole
        micro-batches are what a later prompt may reuse in exact mode."""
        self._exact[slot] = n_tokens - n_tokens % self.align

    def forget(self, slot: int) -> None:
        L.llama_memory_seq_rm(self.mem, slot, -1, -1)
        self.kv[slot].clear()
        self.starts[slot].clear()
        self.placed[slot] = None
        self.prompt_len[slot] = 0
        self._exact[slot] = 0
        self.rent[slot] = 0.0
        self.warm_until[slot] = 0.0
        self._changed()

    def release(self, slot: int, *, keep: bool, warm: float = 0.0) -> None:
        """A sequence ended: its slot is free, its cache kept for a later prompt if ``keep``,
        and in place for ``warm`` seconds whatever starts meanwhile (``stash_idle``)."""
        if not keep:
            self.forget(slot)
        self.free.append(slot)
        self._last_used[slot] = now = time.monotonic()
        self.warm_until[slot] = now + warm if keep and warm > 0 else 0.0
        self.rent[slot] = 0.0
        self._changed()

    def evict_idle(self) -> bool:
        """Free the cells of the least recently used idle cache of a shared cache (to host
        memory if it fits there); False when none is left."""
        idle = [sl for sl in self.free if self.kv[sl]]
        if not idle:
            return False
        slot = min(idle, key=lambda sl: self._last_used[sl])
        if not self.stash(slot):
            self.forget(slot)
        return True

    # -- idle caches in host memory (a shared "reuse" cache) -----------------------------------
    def stash_idle(
        self, upcoming: int | None = None, answer: int = 0, *, keep_warm: bool = False
    ) -> None:
        """Move the idle caches in place to host memory: all of them (the warm ones stay with
        ``keep_warm``), or, as a sequence starts that will read ``upcoming`` tokens and then
        decode about ``answer``, those worth moving now. The new cells then go where theirs
        were, low in the cache: placed after them, they would keep every step's attention span
        that long after the idle caches left. A cache in few ranges (a prompt, an answer
        decoded alone) is a cheap copy and always leaves, unless
        a running sequence shares most of its cells: the copy takes those too and frees only its
        own (an editor's last completion beside the next keystroke's, which continues its
        prompt: ~11 ms of copying before every completion's first token, for some 20 cells),
        so it goes by its rent like a scattered one. An interactive request's cache stays while
        it is warm (``release``): an editor's next keystroke comes within a second or two and
        continues its prompt; copied out as an agent's or a chat's request started, it was
        copied back for the keystroke (10-190 ms before its first token, the other idle caches
        copied out first) for most keystrokes beside an agent and two chats. A scattered one (a
        batch's answers) leaves when the rent it would be charged while the new sequence runs
        beside the running ones (their tokens, each attending its cells) adds up to its copy's
        cost, so it would leave before long anyway; else it stays until its rent does
        (``charge``). One that lies interleaved with a running sequence's cells (they were
        decoded in the same steps) stays too: those cells keep the attention span where it is
        whether it leaves or not, and a burst of requests continuing a batch's conversations
        then finds every one in place (copied out by the first to start, each was copied back
        by its own: 8 streams' first tokens waited ~200 ms). None moves while all the cells,
        the upcoming ones too, fit in llama.cpp's padding."""
        idle = [sl for sl in self.free if self.kv[sl]]
        if upcoming is not None and self._in_use() + upcoming <= KV_PAD:
            return
        own = self._own_cells() if upcoming is not None else {}
        queries = self.busy() * answer + (upcoming or 0)
        now = time.monotonic()
        for slot in idle:
            if (upcoming is not None or keep_warm) and self._warm(slot, now):
                continue
            if (
                upcoming is None
                or (self.ranges(slot) <= REGEN_KEEP_RANGES and 2 * own[slot] >= len(self.kv[slot]))
                or (
                    self.rent[slot] + queries * own.get(slot, 0) >= self.copy_cost(slot)
                    and not self._interleaved(slot)
                )
            ):
                self.stash(slot)

    def _interleaved(self, slot: int) -> bool:
        """Whether a running sequence's own cells were placed in the same steps as ``slot``'s."""
        mine = self.placed[slot]
        if mine is None:
            return False
        return any(
            (theirs := self.placed[sl]) is not None
            and theirs[0] <= mine[1]
            and mine[0] <= theirs[1]
            for sl in range(len(self.kv))
            if sl not in self.free
        )

    def _own_cells(self) -> dict[int, int]:
        """Each idle cache's cells that no running sequence shares."""
        busy = [self.kv[sl] for sl in range(len(self.kv)) if sl not in self.free]
        return {
            sl: len(self.kv[sl]) - max((common_prefix(self.kv[sl], b) for b in busy), default=0)
            for sl in self.free
            if self.kv[sl]
        }

    def _in_use(self) -> int:
        """The cells in use, about: the slots' tokens, a common prefix counted once."""
        held = sorted(k for k in self.kv if k)
        return sum(map(len, held)) - sum(
            common_prefix(a, b) for a, b in zip(held, held[1:], strict=False)
        )

    def stash(self, slot: int) -> bool:
        """Copy an idle slot's cache to host memory and free its cells. The least recently used
        copies make room; False (the cache stays in place) when it cannot be kept there."""
        tokens = self.kv[slot]
        if not self.stash_cells or not tokens:
            return False
        size = L.llama_state_seq_get_size(self.ctx, slot)
        # the bound: the cache's cells at this copy's bytes a token
        bound = self.stash_limit = min(STASH_CAP, self.stash_cells * size // len(tokens))
        if size == 0 or size > bound:
            return False
        # a copy whose tokens begin this one's is contained in it
        for e in [e for e in self.stashed if tokens[: len(e.tokens)] == e.tokens]:
            self._drop(e)
        while self.stashed_bytes + size > bound:
            self._drop(min(self.stashed, key=lambda e: e.last_used))
        data = mmap.mmap(-1, size)
        view = _bytes(data)
        n = L.llama_state_seq_get_data(self.ctx, view, size, slot)
        del view
        if n != size:
            data.close()
            return False
        self.stashed.append(_Stashed(list(tokens), data, size, self._last_used[slot]))
        self.stashed_bytes += size
        self.forget(slot)
        return True

    def _drop(self, e: _Stashed, *, close: bool = True) -> None:
        self.stashed.remove(e)
        self.stashed_bytes -= e.size
        if close:
            e.data.close()

    def clear_stash(self) -> None:
        """Give every host copy's memory back (the model is being freed)."""
        for e in list(self.stashed):
            self._drop(e)

    def _restore_for(self, tokens: list[int], beat: int) -> int | None:
        """A free slot holding the host copy that shares the longest prefix with ``tokens``,
        when that is longer than ``beat`` (the best cache in place); None otherwise."""
        best, n = None, beat
        for e in self.stashed:
            shared = min(common_prefix(e.tokens, tokens), len(tokens) - 1)
            if shared > n:
                best, n = e, shared
        if best is None:
            return None
        # a copy holding more than the prompt shares (another turn of that conversation) stays
        # for it; one the prompt continues leaves host memory (stashed again when idle)
        partial = len(best.tokens) - n >= KEEP_TAIL_MIN
        self._drop(best, close=False)  # out of the list while it is restored
        # the idle caches in place go first (the caller would move them next): the copy's
        # cells then lie in the order they were computed in, so its sums add up as they did;
        # a warm one stays (beside an agent and two chats, an editor's last keystroke was
        # copied out this way ~25 times in 45 s, each copied back by the next keystroke)
        self.stash_idle(keep_warm=True)
        slot = min(self.free, key=lambda sl: (bool(self.kv[sl]), self._last_used[sl]))
        if self.kv[slot]:
            self.forget(slot)  # an idle cache that did not fit in host memory
        view = _bytes(best.data)
        restored = L.llama_state_seq_set_data(self.ctx, view, best.size, slot) == best.size
        del view
        if not restored:
            L.llama_memory_seq_rm(self.mem, slot, -1, -1)  # no room for it now
        if (partial or not restored) and self.stashed_bytes + best.size <= self.stash_limit:
            best.last_used = time.monotonic()
            self.stashed.append(best)  # kept for later
            self.stashed_bytes += best.size
        else:
            best.data.close()
        if not restored:
            return None
        self.kv[slot] = list(best.tokens)
        self.starts[slot] = [0]  # restored into free cells, mostly together
        self._placements += 1
        self.placed[slot] = (self._placements, self._placements)
        self._last_placed = -1
        self.prompt_len[slot] = 0
        self._exact[slot] = 0
        self.restores += 1
        return slot
