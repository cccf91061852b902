"""A GGUF engine's prompt scoring (echo, prompt_logprobs): every prompt token's log-probability
after the tokens before it, its rank, and the most likely tokens at its place. Part of
LlamaEngine; worker thread only, between decode steps (a job, never a generation).

A prefix shared with a prompt scored shortly before (a question before several answers) is
read once: its rows come from a small memo of recent scores, and the cache keeps its tokens up
to the last shared one, which is read again for the first new token's row.
Tested by tests/runtimes/llama/test_scoring.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from app.core.types import PromptToken, ScoredPrompt
from app.runtimes.llama.backend import L
from app.runtimes.worker import common_prefix

MAX_TOP = 20  # the most alternatives a place lists (vLLM's bound); the memo keeps them all
MEMO_PROMPTS = 16  # recent scored prompts whose rows a later prompt may share


class PromptScoring:
    ctx: Any
    batch: Any
    slots: Any
    n_ctx: int
    n_batch: int
    n_vocab: int
    prompt_cache: bool

    _put: Callable[..., None]  # LlamaEngine's: one token into its batch
    _decode: Callable[..., int]  # LlamaEngine's: decode the batch (idle caches make room)

    # recent prompts and their scored tokens (every place's MAX_TOP alternatives), newest last
    _scored: list[tuple[list[int], list[PromptToken]]] | None = None

    def score_prompt(self, tokens: list[int], top: int) -> ScoredPrompt:
        """Score one prompt (worker thread only): its tokens with ``top`` alternatives each."""
        n = len(tokens)
        if n == 0:
            raise ValueError("empty prompt")
        if n > self.n_ctx:
            raise ValueError("prompt does not fit the context")
        memo = self._scored if self._scored is not None else []
        self._scored = memo
        shared, rows = 0, [PromptToken(tokens[0], None, None)]
        for past, scored in memo:
            p = common_prefix(past, tokens)
            if p > shared:
                shared, rows = p, scored[:p]
        decoded = 0
        if shared < n:
            decoded = self._read_rows(tokens, max(shared, 1) - 1, rows)
        memo[:] = [m for m in memo if m[0] != tokens][-(MEMO_PROMPTS - 1) :]
        memo.append((list(tokens), rows))
        return ScoredPrompt(tuple(_trim(r, top) for r in rows), decoded)

    def _read_rows(self, tokens: list[int], first: int, rows: list[PromptToken]) -> int:
        """Decode ``tokens`` from what the cache keeps (at most ``first`` of them) with logits
        from position ``first`` on, appending each next token's row. Returns tokens decoded."""
        n = len(tokens)
        if not self.slots.free:
            raise RuntimeError("every sequence of the model is busy; retry shortly")
        slot = self.slots.take(tokens)
        done = False
        try:
            # keep at most ``first`` tokens: position ``first`` is read again for its logits
            kept = self.slots.reuse(slot, tokens[: first + 1])
            self.slots.prompt_len[slot] = n
            pos = kept
            while pos < n:
                chunk = tokens[pos : pos + self.n_batch]
                wanted = []
                for i, t in enumerate(chunk):
                    out = first <= pos + i <= n - 2
                    self._put(i, t, pos + i, slot, logits=out)
                    if out:
                        wanted.append(i)
                self.batch.n_tokens = len(chunk)
                rc = self._decode()
                if rc != 0:
                    raise RuntimeError(
                        f"llama_decode failed while scoring the prompt (code {rc}; "
                        "1: no room in the cache beside the running requests)"
                    )
                self.slots.append(slot, chunk)
                if wanted:
                    rows.extend(self._rows(wanted, [tokens[pos + i + 1] for i in wanted]))
                pos += len(chunk)
            done = True
            return n - kept
        finally:
            # a failed read leaves cells the slot's record may not match: dropped
            self.slots.release(slot, keep=done and self.prompt_cache)

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


def _trim(t: PromptToken, top: int) -> PromptToken:
    return t if len(t.top) <= top else PromptToken(t.id, t.logprob, t.rank, t.top[:top])
