"""Test helper: a cross-encoder GGUF built from the shared MiniLM embedder.

No small reranker GGUF is on the registries, so this copies MiniLM (every key and tensor as it
is), sets ``bert.pooling_type`` to RANK (4) and adds a classification head (``cls`` n_embd x
n_embd, ``cls.output`` n_embd x 1, seeded random weights): llama.cpp then pools the CLS token
through the head into one relevance score per sequence. Its scores are not meaningful; only
that the rank path runs and scores each document is shown with it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from tests.support.gguf_rewrite import rewrite_gguf

RANK = 4  # LLAMA_POOLING_TYPE_RANK


def write_cross_encoder(src: Path, dst: Path, *, seed: int = 7) -> Path:
    def head(reader: Any, writer: Any) -> None:
        arch = str(reader.fields["general.architecture"].contents())
        writer.add_uint32(f"{arch}.pooling_type", RANK)
        n_embd = int(reader.fields[f"{arch}.embedding_length"].contents())
        rng = np.random.default_rng(seed)
        writer.add_tensor("cls.weight", rng.normal(0, 0.05, (n_embd, n_embd)).astype(np.float32))
        writer.add_tensor("cls.bias", np.zeros(n_embd, dtype=np.float32))
        writer.add_tensor("cls.output.weight", rng.normal(0, 0.5, (1, n_embd)).astype(np.float32))
        writer.add_tensor("cls.output.bias", np.zeros(1, dtype=np.float32))

    return rewrite_gguf(src, dst, drop=lambda name: name.endswith(".pooling_type"), add=head)
