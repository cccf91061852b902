"""Test helper: a cross-encoder GGUF built from the shared MiniLM embedder.

No small reranker GGUF is on the registries, so this copies MiniLM (every key and tensor as it
is), sets ``bert.pooling_type`` to RANK (4) and adds a classification head (``cls`` n_embd x
n_embd, ``cls.output`` n_embd x 1, seeded random weights): llama.cpp then pools the CLS token
through the head into one relevance score per sequence. Its scores are not meaningful; only
that the rank path runs and scores each document is shown with it.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

RANK = 4  # LLAMA_POOLING_TYPE_RANK


def write_cross_encoder(src: Path, dst: Path, *, seed: int = 7) -> Path:
    reader = gguf.GGUFReader(src)
    arch = str(reader.fields["general.architecture"].contents())
    writer = gguf.GGUFWriter(dst, arch)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        if name == f"{arch}.pooling_type":
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, field.contents(), vtype, sub_type=sub)
    writer.add_uint32(f"{arch}.pooling_type", RANK)
    n_embd = int(reader.fields[f"{arch}.embedding_length"].contents())
    for t in reader.tensors:
        # t.data: the element array (F32) or the raw bytes by row (quantized), as written
        writer.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
    rng = np.random.default_rng(seed)
    writer.add_tensor("cls.weight", rng.normal(0, 0.05, (n_embd, n_embd)).astype(np.float32))
    writer.add_tensor("cls.bias", np.zeros(n_embd, dtype=np.float32))
    writer.add_tensor("cls.output.weight", rng.normal(0, 0.5, (1, n_embd)).astype(np.float32))
    writer.add_tensor("cls.output.bias", np.zeros(1, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst
