"""A GGUF engine's pooled outputs: embeddings and cross-encoder rank scores (one input decoded
whole as sequence 0, every position's output kept). Part of LlamaEngine; worker thread only.
Tested by tests/runtimes/llama/test_mixed_batch.py."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from app.errors import InvalidRequest
from app.runtimes.llama.backend import L


class PooledOutputs:
    ctx: Any
    model: Any
    vocab: Any
    mem: Any
    batch: Any
    slots: Any
    n_ctx: int
    is_reranker: bool

    _fill: Callable[..., None]  # LlamaEngine's: one input's tokens into its batch

    def _decode_whole(self, tokens: list[int]) -> None:
        """Decode one input as sequence 0 with every position's output kept (what pooling
        reads), after forgetting whatever sequence 0 held."""
        self.slots.forget(0)
        self._fill(tokens, 0, 0, logits_last=False)
        for i in range(len(tokens)):
            self.batch.logits[i] = 1
        rc = L.llama_decode(self.ctx, self.batch)
        if rc != 0:
            raise RuntimeError(f"llama_decode failed on the input (code {rc})")

    def embed(self, tokens: list[int]) -> list[float]:
        """The pooled, L2-normalized embedding of one input (worker thread only)."""
        if not tokens:
            raise ValueError("empty input")
        if self.is_reranker:  # its pooled output is n_cls_out floats: n_embd would overread
            raise InvalidRequest("a cross-encoder scores pairs; it has no embeddings")
        self._decode_whole(tokens)
        n_embd = L.llama_model_n_embd(self.model)
        ptr = L.llama_get_embeddings_seq(self.ctx, 0)
        if not ptr:
            ptr = L.llama_get_embeddings_ith(self.ctx, len(tokens) - 1)
        vec = [float(ptr[i]) for i in range(n_embd)]
        L.llama_memory_seq_rm(self.mem, 0, -1, -1)
        norm = sum(x * x for x in vec) ** 0.5
        return [x / norm for x in vec] if norm > 0 else vec

    def rank_pair(self, query: list[int], doc: list[int]) -> list[int]:
        """A cross-encoder's input, framed as llama.cpp's server frames it (BOS query EOS SEP
        document EOS, each special token where the vocabulary asks for it)."""
        eos = L.llama_vocab_eos(self.vocab)
        if eos < 0:
            eos = L.llama_vocab_sep(self.vocab)
        out: list[int] = []
        if L.llama_vocab_get_add_bos(self.vocab):
            out.append(L.llama_vocab_bos(self.vocab))
        out += query
        if L.llama_vocab_get_add_eos(self.vocab):
            out.append(eos)
        if L.llama_vocab_get_add_sep(self.vocab):
            out.append(L.llama_vocab_sep(self.vocab))
        out += doc
        if L.llama_vocab_get_add_eos(self.vocab):
            out.append(eos)
        return out

    def score(self, tokens: list[int]) -> float:
        """A cross-encoder's relevance score for one framed pair (rank pooling: the sequence's
        output is ``n_cls_out`` floats, the first the score; worker thread only)."""
        if not tokens:
            raise ValueError("empty input")
        if len(tokens) > self.n_ctx:
            raise InvalidRequest(
                f"a query and document take {len(tokens)} tokens; this model takes at most "
                f"{self.n_ctx}",
                param="documents",
            )
        self._decode_whole(tokens)
        ptr = L.llama_get_embeddings_seq(self.ctx, 0)
        L.llama_memory_seq_rm(self.mem, 0, -1, -1)
        if not ptr:
            raise RuntimeError("llama.cpp gave no rank score (is the model a cross-encoder?)")
        return float(ptr[0])
