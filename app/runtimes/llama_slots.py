"""Which tokens each sequence slot of a llama.cpp context holds in its KV cache, and how a new
prompt reuses them (the prompt cache). Worker thread only.

A slot is a llama.cpp sequence id. Each remembers the tokens its cells hold (prompt and
generated answer). "reuse" continues a prompt from the whole prefix it shares with a slot; a
common prefix can also be given to another slot, so several conversations keep their caches: in
a shared (unified) cache by sharing its cells (counted once), with a stream per sequence by
copying the stream when the prefix is long enough to be worth it (COPY_MIN). "exact" also counts how many tokens were
computed as whole micro-batches aligned at multiples of n_ubatch, the way a fresh run computes a
prompt, and reuses only those: the rest is computed in the same batches as a fresh run would, so
the output is bit-identical to an uncached run. "off" keeps nothing.

In a shared cache every step's attention walks all used cells, idle conversations' included
(they made a 10-token prompt's decode 25% slower with 3,000 idle cells, and a batch of 8
streams ~8% slower). So a "reuse" shared cache moves idle caches to host memory (llama.cpp's
sequence state, a copy: ~4 us a token for SmolLM2) when another sequence needs the cache, and
restores one when a prompt continues it further than any cache in place, within a byte bound
that the memory estimate counts (``fit.prompt_ram``).
"""

from __future__ import annotations

import ctypes
import mmap
import time
from dataclasses import dataclass
from typing import Any

from app.core.fit import STASH_CAP
from app.runtimes.llama_backend import L
from app.runtimes.worker import common_prefix

# a host copy holding this many tokens more than a prompt shares with it (another answer to the
# same question) is kept when the prompt's part is restored; with fewer, the copy is the prompt's
KEEP_TAIL_MIN = 16
# with a stream per sequence, a common prefix this long or longer is copied into another slot's
# stream (llama.cpp copies the whole stream's buffer) rather than computed again
COPY_MIN = 64


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


class Slots:
    def __init__(
        self,
        mem: Any,
        n_slots: int,
        *,
        mode: str,
        shared: bool,
        align: int,
        n_swa: int,
        ctx: Any = None,
        cells: int = 0,
    ) -> None:
        self.mem = mem
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
        self.free = list(range(n_slots))
        self._exact = [0] * n_slots
        self._last_used = [0.0] * n_slots

    def busy(self) -> int:
        """Slots taken by running (or parked) sequences."""
        return len(self.kv) - len(self.free)

    def take(self, tokens: list[int]) -> int:
        """A free slot for ``tokens``: the one whose cache shares the longest prefix with them.
        When that cache also holds more (another conversation's turn), the common prefix goes
        to an empty or the least recently used slot instead, so the other conversation keeps
        its cache."""
        free, kv = self.free, self.kv
        best = max(free, key=lambda sl: (common_prefix(kv[sl], tokens), -len(kv[sl])))
        restored = self._restore_for(tokens, min(common_prefix(kv[best], tokens), len(tokens) - 1))
        if restored is not None:
            free.remove(restored)
            return restored
        slot = best
        if self.mode == "reuse" and len(free) > 1:
            shared = min(common_prefix(kv[best], tokens), len(tokens) - 1)
            if shared < len(kv[best]) and self._elsewhere(best, shared, len(tokens)):
                slot = min(
                    (sl for sl in free if sl != best),
                    key=lambda sl: (bool(kv[sl]), self._last_used[sl]),
                )
                self.forget(slot)
                if shared > 0 and not self._breaks_swa(best, shared):
                    self._give_prefix(best, slot, shared)
        free.remove(slot)
        return slot

    def _elsewhere(self, best: int, shared: int, n_prompt: int) -> bool:
        """Whether a prompt of ``n_prompt`` tokens sharing ``shared`` with slot ``best`` (which
        holds more) goes to another slot. In a shared cache always (its spare slots keep idle
        caches). With a stream per sequence, each slot is one conversation's cache: to an empty
        stream if one is free; else only when the prompt parts from ``best`` early (another
        conversation: the least recently used one gives up its stream). A prompt wholly in
        ``best`` (a regenerated answer) or keeping most of it (its own follow-up) stays."""
        if self.shared:
            return True
        if any(not self.kv[sl] for sl in self.free if sl != best):
            return True
        return shared < n_prompt - 1 and shared * 2 < len(self.kv[best])

    def _give_prefix(self, src: int, dst: int, n: int) -> None:
        """Slot ``dst`` (empty) starts with the first ``n`` cached tokens of ``src``."""
        if self.shared:
            L.llama_memory_seq_cp(self.mem, src, dst, 0, n)
        elif n >= COPY_MIN:
            # across streams llama.cpp copies a whole stream (at the next decode); then the
            # copy's tail is dropped
            L.llama_memory_seq_cp(self.mem, src, dst, -1, -1)
            if not L.llama_memory_seq_rm(self.mem, dst, n, -1):
                L.llama_memory_seq_rm(self.mem, dst, -1, -1)
                return
        else:
            return
        self.kv[dst] = self.kv[src][:n]

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
        del kv[keep:]
        self._exact[slot] = keep
        return keep

    def computed_whole(self, slot: int, n_tokens: int) -> None:
        """A prompt of ``n_tokens`` was read from the start of a micro-batch: its whole
        micro-batches are what a later prompt may reuse in exact mode."""
        self._exact[slot] = n_tokens - n_tokens % self.align

    def forget(self, slot: int) -> None:
        L.llama_memory_seq_rm(self.mem, slot, -1, -1)
        self.kv[slot].clear()
        self._exact[slot] = 0

    def release(self, slot: int, *, keep: bool) -> None:
        """A sequence ended: its slot is free, its cache kept for a later prompt if ``keep``."""
        if not keep:
            self.forget(slot)
        self.free.append(slot)
        self._last_used[slot] = time.monotonic()

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
    def stash_idle(self, keep: int | None = None) -> None:
        """Move every idle cache but slot ``keep``'s to host memory."""
        for slot in self.free:
            if slot != keep and self.kv[slot]:
                self.stash(slot)

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
        # cells then lie in the order they were computed in, so its sums add up as they did
        self.stash_idle()
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
        self._exact[slot] = 0
        self.restores += 1
        return slot
