"""A GGUF engine's prompt scoring (echo, prompt_logprobs): every prompt token's log-probability
after the tokens before it, its rank, and the most likely tokens at its place. Part of
LlamaEngine; worker thread only, between decode steps (a job, never a generation).

A request's list is scored in waves: as many prompts as there are free slots, read together in
shared decodes of up to ``n_batch`` tokens (each prompt on its own slot, logits where its rows
are needed). Prompts of a wave that share a prefix (a question before several answers) form a
group: the prefix is read once on one slot and the others start from a copy of its cells. A
prefix shared with a prompt scored shortly before is read once too: its rows come from a small
memo of recent scores, and the cache keeps its tokens up to the last shared one, which each
prompt reads again for its first new token's row. That is a cache per sequence (``kv_layout``
``per-sequence``, or the ``exact`` prompt cache). In a shared cache llama.cpp's CPU attention
moves rows read beside other sequences or after cells read before (up to ~0.9 in
log-probability, tests/bench/attention_paths.py), so there each prompt is read whole and alone:
idle caches leave the cache first, and its own cells are not kept.
Tested by tests/runtimes/llama/test_scoring.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from app.core.types import PromptToken, ScoredPrompt
from app.runtimes.llama.backend import L
from app.runtimes.worker import common_prefix

MAX_TOP = 20  # the most alternatives a place lists (vLLM's bound); the memo keeps them all
MEMO_PROMPTS = 16  # recent scored prompts whose rows a later prompt may share
SHARE_MIN = 2  # prompts of a wave sharing at least this many tokens read them once


@dataclass(slots=True)
class _Prompt:
    """A prompt of a wave: its rows so far, and the tokens and decodes its reading took."""

    tokens: list[int]
    rows: list[PromptToken]
    decoded: int = 0
    decodes: int = 0


@dataclass(slots=True)
class _Read:
    """One slot's part of a wave: ``tokens[pos:end]`` to decode, each next token's row from
    position ``first`` on appended to ``rows``."""

    slot: int
    tokens: list[int]
    pos: int
    end: int
    first: int
    rows: list[PromptToken]
    kept: int = 0  # the tokens its slot's cache already held
    decodes: int = 0


class PromptScoring:
    ctx: Any
    batch: Any
    slots: Any
    n_ctx: int
    n_batch: int
    n_vocab: int
    prompt_cache: bool
    unified: bool
    peak_batch: int

    _put: Callable[..., None]  # LlamaEngine's: one token into its batch
    _decode: Callable[..., int]  # LlamaEngine's: decode the batch (idle caches make room)

    # recent prompts and their scored tokens (every place's MAX_TOP alternatives), newest last
    _scored: list[tuple[list[int], list[PromptToken]]] | None = None

    def score_prompt(self, tokens: list[int], top: int) -> ScoredPrompt:
        """Score one prompt (worker thread only): its tokens with ``top`` alternatives each."""
        [one] = self.score_wave([tokens], top)
        return one

    def score_wave(self, prompts: list[list[int]], top: int) -> list[ScoredPrompt]:
        """Score the first prompts of ``prompts`` (worker thread only), at least one: as many
        as the free slots read together, within a context's tokens in a shared cache. The
        caller scores the rest in later waves, between the running generations' steps."""
        memo = self._scored if self._scored is not None else []
        self._scored = memo
        wave: list[_Prompt] = []
        slots, room = len(self.slots.free), self.n_ctx
        for tokens in prompts:
            n = len(tokens)
            if n == 0:
                raise ValueError("empty prompt")
            if n > self.n_ctx:
                raise ValueError("prompt does not fit the context")
            p = _Prompt(list(tokens), _known(memo, tokens))
            if self.unified and len(p.rows) < n:
                # llama.cpp's CPU attention in a shared cache gives rows off by up to ~0.9 for
                # a sequence read beside others or continued on cells read before (measured,
                # tests/bench/attention_paths.py); one prompt read whole, from its first token
                # on, in its own decode gives the model's own values
                p.rows = p.rows[:1]
                if wave:
                    break
            if len(p.rows) < n:
                if not slots:
                    if not wave:
                        raise RuntimeError("every sequence of the model is busy; retry shortly")
                    break
                # a shared cache holds the wave's new cells beside the others' (one prompt
                # always goes: it fits alone, as before)
                new = n - (common_prefix(wave[-1].tokens, tokens) if wave else 0)
                if wave and self.unified and new > room:
                    break
                slots, room = slots - 1, room - new
            wave.append(p)
        need = [p for p in wave if len(p.rows) < len(p.tokens)]
        if need and self.unified:
            # ... and alone in the cache: idle caches go to host memory (or are dropped) first
            while self.slots.evict_idle():
                pass
        if need:
            self._read_wave(need)
        for p in wave:
            memo[:] = [m for m in memo if m[0] != p.tokens][-(MEMO_PROMPTS - 1) :]
            memo.append((p.tokens, p.rows))
        return [
            ScoredPrompt(tuple(_trim(r, top) for r in p.rows), p.decoded, p.decodes) for p in wave
        ]

    def _read_wave(self, need: list[_Prompt]) -> None:
        """Read the rows ``need`` lacks: each group's shared prefix once, then every prompt's
        own tokens together; each takes a slot (released after, its cache kept)."""
        taken: list[int] = []
        done = False
        try:
            heads = [self._head(g, taken) for g in _groups(need)]
            self._decode_reads([r for _, r in heads if r.pos < r.end])
            reads: list[tuple[_Prompt, _Read]] = []
            for group, head in heads:
                shared = len(head.tokens)  # 0: a prompt read alone
                for p in group:
                    if len(p.rows) < shared:
                        p.rows = list(head.rows[:shared])
                    if group[0] is p:  # the prefix is read with the group's first prompt
                        p.decoded += head.end - head.kept
                        p.decodes += head.decodes
                    if len(p.rows) < len(p.tokens):
                        reads.append((p, self._own_read(p, head, taken, reads)))
            self._decode_reads([r for _, r in reads])
            for p, r in reads:
                p.decodes += r.decodes
            done = True
        finally:
            # a failed read leaves cells the slots' records may not match: dropped
            for slot in taken:
                self.slots.release(slot, keep=done and self.prompt_cache and not self.unified)

    def _head(self, group: list[_Prompt], taken: list[int]) -> tuple[list[_Prompt], _Read]:
        """The read of a group's shared prefix, up to (not with) its last token, which each
        prompt reads again for its own first new row; an empty one (slot -1) for a lone prompt."""
        if len(group) < 2:
            return group, _Read(-1, [], 0, 0, 0, [])
        n = len(group[0].tokens)
        for p in group[1:]:
            n = min(n, common_prefix(group[0].tokens, p.tokens))
        prefix = group[0].tokens[:n]
        rows = max((p.rows for p in group), key=len)[:n]
        first = len(rows) - 1  # rows from here on are read; with all known, cells only
        slot = self.slots.take(group[0].tokens)
        taken.append(slot)
        kept = self.slots.reuse(slot, prefix[: first + 1])
        self.slots.prompt_len[slot] = n
        return group, _Read(slot, prefix, kept, n - 1, first, list(rows), kept)

    def _own_read(
        self, p: _Prompt, head: _Read, taken: list[int], reads: list[tuple[_Prompt, _Read]]
    ) -> _Read:
        """A prompt's own tokens, on its group's prefix slot (the first to read) or on a slot
        of its own that starts from a copy of the prefix's cells."""
        n = len(p.tokens)
        first = len(p.rows) - 1
        on_head = head.slot >= 0 and not any(r.slot == head.slot for _, r in reads)
        if on_head:
            slot = head.slot
        else:
            slot = self.slots.take(p.tokens)
            taken.append(slot)
        kept = self.slots.reuse(slot, p.tokens[: first + 1])
        if not on_head and head.slot >= 0 and kept < head.end:
            kept = self.slots.share_prefix(head.slot, slot, head.end)
        self.slots.prompt_len[slot] = n
        p.decoded += n - kept
        return _Read(slot, p.tokens, kept, n, first, p.rows)

    def _decode_reads(self, reads: list[_Read]) -> None:
        """Decode the reads' tokens in shared batches of up to ``n_batch`` tokens, the reads in
        order, appending each read's rows as its logits come."""
        active = [r for r in reads if r.pos < r.end]
        while active:
            n = 0
            parts: list[tuple[_Read, list[int], int, list[int]]] = []
            for r in active:
                if n == self.n_batch:
                    break
                chunk = r.tokens[r.pos : min(r.end, r.pos + self.n_batch - n)]
                wanted = []
                for j, t in enumerate(chunk):
                    pos = r.pos + j
                    out = r.first <= pos < len(r.tokens) - 1
                    self._put(n + j, t, pos, r.slot, logits=out)
                    if out:
                        wanted.append(n + j)
                parts.append((r, chunk, n, wanted))
                n += len(chunk)
            self.batch.n_tokens = n
            rc = self._decode()
            if rc != 0:
                raise RuntimeError(
                    f"llama_decode failed while scoring the prompt (code {rc}; "
                    "1: no room in the cache beside the running requests)"
                )
            self.peak_batch = max(self.peak_batch, len(parts))
            for r, chunk, at, wanted in parts:
                self.slots.append(r.slot, chunk)
                r.decodes += 1
                if wanted:
                    nxt = [r.tokens[r.pos + i - at + 1] for i in wanted]
                    r.rows.extend(self._rows(wanted, nxt))
                r.pos += len(chunk)
            active = [r for r in active if r.pos < r.end]

    def _rows(self, idx: list[int], next_ids: list[int]) -> list[PromptToken]:
        """Log-softmax of the batch's output rows ``idx``, read at each next token."""
        import numpy as np

        m = np.stack(
            [
                np.ctypeslib.as_array(L.llama_get_logits_ith(self.ctx, i), shape=(self.n_vocab,))
                for i in idx
            ]
        ).astype(np.float64)
        lse = m.max(axis=1)
        lse = lse + np.log(np.exp(m - lse[:, None]).sum(axis=1))
        k = min(MAX_TOP, self.n_vocab)
        best = np.argpartition(-m, k - 1, axis=1)[:, :k]
        out = []
        for r, tok in enumerate(next_ids):
            row = m[r]
            ids = best[r][np.argsort(-row[best[r]], kind="stable")]
            out.append(
                PromptToken(
                    tok,
                    float(row[tok] - lse[r]),
                    int((row > row[tok]).sum()) + 1,
                    tuple((int(i), float(row[i] - lse[r])) for i in ids),
                )
            )
        return out


def _known(memo: list[tuple[list[int], list[PromptToken]]], tokens: list[int]) -> list[PromptToken]:
    """The rows of ``tokens`` a recently scored prompt shares (at least the first token's)."""
    shared, rows = 0, [PromptToken(tokens[0], None, None)]
    for past, scored in memo:
        p = common_prefix(past, tokens)
        if p > shared:
            shared, rows = p, scored[:p]
    return list(rows)


def _groups(need: list[_Prompt]) -> list[list[_Prompt]]:
    """The wave's prompts by shared prefix, in order: a prompt joins the group whose first
    prompt shares the most with it, at least SHARE_MIN tokens and at least half of what the
    group shares so far (a question's answers that begin alike still join; another question
    after the same instructions starts its own group)."""
    groups: list[tuple[list[_Prompt], int]] = []
    for p in need:
        best, c = -1, 0
        for i, (g, shared) in enumerate(groups):
            k = common_prefix(g[0].tokens, p.tokens)
            if k > c and k >= SHARE_MIN and (len(g) == 1 or 2 * k >= shared):
                best, c = i, k
        if best < 0:
            groups.append(([p], len(p.tokens)))
        else:
            g, shared = groups[best]
            g.append(p)
            groups[best] = (g, min(shared, c))
    return [g for g, _ in groups]


def _trim(t: PromptToken, top: int) -> PromptToken:
    return t if len(t.top) <= top else PromptToken(t.id, t.logprob, t.rank, t.top[:top])
