"""How far llama.cpp's attention paths move a prompt's log-probabilities from the same tokens
read alone, in process (not collected by pytest; a measurement, not a timing).

Run:  python tests/bench/attention_paths.py [--model PATH] [--offsets 20]

For each cache layout Hearth can load (a shared cache, ``kv_unified``, with flash attention off
and on; a cache per sequence), it reads the same tokens in the patterns a server produces: one
prompt whole after another conversation's cells, a prompt continued on cells it read before,
and three prompts that share a beginning read in one batch, each after ``k`` cells of another
conversation (k = 0 .. --offsets-1). It prints, per layout and pattern, the largest
difference in log-probability from each prompt read alone in a fresh context, and at which
offsets it was above 1e-3. Measured with llama-cpp-python 0.3.36 on an AMD EPYC (AVX2): a
shared cache without flash attention is off by up to 0.9 in the batched and continued
patterns, a cache per sequence by 0.0 in all of them (Hearth's prompt scoring relies on that:
app/runtimes/llama/scoring.py).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from app.runtimes.llama.backend import L, ensure_backend  # noqa: E402
from tests.bench.vs_llama_server import default_model  # noqa: E402

PREFIX = [504, 3575, 282, 4649, 314, 216, 13, 9, 2, 77]
SUFFIXES = [[7042, 13, 88], [4528, 1234], [253, 21285, 9, 2, 5]]
LAYOUTS = {
    "shared, flash attention off": (True, 0),
    "shared, flash attention on": (True, 1),
    "per sequence, flash attention off": (False, 0),
}


class Context:
    """One llama.cpp context over the model: decode items, read log-softmax rows."""

    def __init__(self, model: Any, n_vocab: int, *, unified: bool, fa: int, n_seq: int) -> None:
        cp = L.llama_context_default_params()
        cp.n_ctx = 1024 * (1 if unified else n_seq)
        cp.n_batch = cp.n_ubatch = 512
        cp.n_seq_max = n_seq
        cp.kv_unified = unified
        cp.flash_attn_type = fa
        self.ctx = L.llama_init_from_model(model, cp)
        self.mem = L.llama_get_memory(self.ctx)
        self.batch = L.llama_batch_init(512, 0, n_seq)
        self.n_vocab = n_vocab

    def decode(self, items: list[tuple[int, int, int, bool]]) -> None:
        """(token, position, sequence, logits) each."""
        b = self.batch
        for i, (t, pos, seq, logits) in enumerate(items):
            b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = t, pos, 1, int(logits)
            b.seq_id[i][0] = seq
        b.n_tokens = len(items)
        if L.llama_decode(self.ctx, b) != 0:
            raise RuntimeError("llama_decode failed")

    def row(self, i: int) -> Any:
        import numpy as np

        m = np.ctypeslib.as_array(
            L.llama_get_logits_ith(self.ctx, i), shape=(self.n_vocab,)
        ).astype(np.float64)
        return m - (m.max() + np.log(np.exp(m - m.max()).sum()))

    def close(self) -> None:
        L.llama_batch_free(self.batch)
        L.llama_free(self.ctx)


def alone(model: Any, n_vocab: int, tokens: list[int], fa: int) -> list[Any]:
    c = Context(model, n_vocab, unified=True, fa=fa, n_seq=1)
    c.decode([(t, i, 0, True) for i, t in enumerate(tokens)])
    rows = [c.row(i).copy() for i in range(len(tokens))]
    c.close()
    return rows


def whole(c: Context, k: int, refs: list[list[Any]]) -> float:
    tokens = PREFIX + SUFFIXES[0]
    c.decode([(t, i, 1, True) for i, t in enumerate(tokens)])
    return max(float(abs(c.row(i) - refs[0][i]).max()) for i in range(len(tokens)))


def continued(c: Context, k: int, refs: list[list[Any]]) -> float:
    c.decode([(t, i, 1, False) for i, t in enumerate(PREFIX)])
    rest = SUFFIXES[0]
    c.decode([(t, len(PREFIX) + i, 1, True) for i, t in enumerate(rest)])
    return max(float(abs(c.row(i) - refs[0][len(PREFIX) + i]).max()) for i in range(len(rest)))


def batched(c: Context, k: int, refs: list[list[Any]]) -> float:
    items, where = [], []
    for s, suffix in enumerate(SUFFIXES):
        for i, t in enumerate(PREFIX + suffix):
            where.append((s, i, len(items)))
            items.append((t, i, 1 + s, True))
    c.decode(items)
    return max(float(abs(c.row(at) - refs[s][i]).max()) for s, i, at in where)


PATTERNS: dict[str, Callable[[Context, int, list[list[Any]]], float]] = {
    "one prompt whole": whole,
    "a prompt continued on its cells": continued,
    "three prompts in one batch": batched,
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--offsets", type=int, default=20)
    args = ap.parse_args()
    ensure_backend()
    path = args.model or default_model()
    model = L.llama_model_load_from_file(str(path).encode(), L.llama_model_default_params())
    n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
    for layout, (unified, fa) in LAYOUTS.items():
        refs = [alone(model, n_vocab, PREFIX + s, fa) for s in SUFFIXES]
        for name, pattern in PATTERNS.items():
            worst, bad = 0.0, []
            for k in range(args.offsets):
                c = Context(model, n_vocab, unified=unified, fa=fa, n_seq=8)
                if k:  # another conversation's cells first
                    c.decode([(300 + i, i, 7, False) for i in range(k)])
                d = pattern(c, k, refs)
                c.close()
                worst = max(worst, d)
                if d > 1e-3:
                    bad.append(k)
            print(f"{layout:36} {name:32} max |diff| {worst:.4f}  off at k={bad}")
    L.llama_model_free(model)


if __name__ == "__main__":
    main()
