"""A GGUF engine's samplers and logprobs: one llama.cpp sampler chain per sequence (grammar,
logit bias, penalties, then greedy or top-k/top-p/min-p/infill/temperature/seeded draw), and the
log-softmax of one row of logits. Part of LlamaEngine; worker thread only.
Tested by tests/runtimes/llama/test_mixed_batch.py."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from app.core.types import SamplingParams, TokenLogprob
from app.runtimes.llama.backend import L

PENALTY_LAST_N = 64


class Sampling:
    ctx: Any
    vocab: Any
    n_vocab: int
    default_seed: int | None

    _piece_of: Callable[[int, bool], bytes]  # LlamaEngine's: a token's bytes

    @staticmethod
    def _uses_penalties(s: SamplingParams) -> bool:
        return s.repeat_penalty != 1.0 or bool(s.frequency_penalty) or bool(s.presence_penalty)

    def _sampler(
        self, s: SamplingParams, grammar: str | None = None, history: tuple[int, ...] = ()
    ) -> Any:
        chain = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
        add = lambda smp: L.llama_sampler_chain_add(chain, smp)  # noqa: E731
        if grammar is not None:  # first: everything after it sees only allowed tokens
            g = L.llama_sampler_init_grammar(self.vocab, grammar.encode(), b"root")
            if not g:
                L.llama_sampler_free(chain)
                raise ValueError("the grammar did not compile")
            add(g)
        if s.logit_bias:
            arr = (L.llama_logit_bias * len(s.logit_bias))()
            for i, (tok, bias) in enumerate(s.logit_bias):
                arr[i].token = tok  # type: ignore[assignment]
                arr[i].bias = bias
            add(L.llama_sampler_init_logit_bias(self.n_vocab, len(s.logit_bias), arr))
        if self._uses_penalties(s):
            pen = L.llama_sampler_init_penalties(
                self.n_vocab,
                PENALTY_LAST_N,
                s.repeat_penalty,
                s.frequency_penalty,
                s.presence_penalty,
            )
            # penalties look at recent history, the prompt included (as llama-server does); fed
            # to this sampler alone: a grammar fed the prompt's tokens aborts the process
            for t in history[-PENALTY_LAST_N:]:
                if t >= 0:  # image positions (negative pseudo-tokens) are no vocabulary
                    L.llama_sampler_accept(pen, t)
            add(pen)
        if s.temperature <= 0:
            add(L.llama_sampler_init_greedy())
            return chain
        if s.top_k > 0:
            add(L.llama_sampler_init_top_k(s.top_k))
        if s.top_p < 1.0:
            add(L.llama_sampler_init_top_p(s.top_p, 1))
        if s.min_p > 0.0:
            add(L.llama_sampler_init_min_p(s.min_p, 1))
        if s.infill:
            add(L.llama_sampler_init_infill(self.vocab))
        add(L.llama_sampler_init_temp(s.temperature))
        seed = s.seed if s.seed is not None else self.default_seed
        if seed is None:
            seed = random.getrandbits(32)
        add(L.llama_sampler_init_dist(seed & 0xFFFFFFFF))
        return chain

    def _logprob(self, idx: int, tok: int, raw: bytes, top_n: int) -> TokenLogprob:
        """Log-softmax of this position's logits (one row, never the whole context's)."""
        import numpy as np

        logits = np.ctypeslib.as_array(L.llama_get_logits_ith(self.ctx, idx), shape=(self.n_vocab,))
        m = float(logits.max())
        lse = m + float(np.log(np.exp(logits - m).sum()))
        top: tuple[tuple[str, float, tuple[int, ...]], ...] = ()
        if top_n > 0:
            ids = np.argpartition(-logits, top_n)[:top_n]
            ids = ids[np.argsort(-logits[ids])]
            top = tuple(
                (b.decode("utf-8", errors="replace"), float(logits[i]) - lse, tuple(b))
                for i in ids
                for b in (self._piece_of(int(i), False),)
            )
        return TokenLogprob(
            raw.decode("utf-8", errors="replace"), float(logits[tok]) - lse, tuple(raw), top
        )
