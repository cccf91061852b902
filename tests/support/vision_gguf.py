"""A real, tiny vision projector (mmproj) GGUF for SmolLM2-135M, written with the ``gguf`` writer.

No vision model small enough is on the package registries, so the tests build one: llama.cpp's
``clip`` loader with projector type ``mlp`` (LLaVA's: a ViT, then linear, GELU, linear into the
text model's embedding space). Tiny dims and seeded random weights: a 32x32 image is cut into
16 patches of 8x8, one ViT block runs (clip's LLaVA graph stops one block before the last, so
two are stored), and the projector maps 32 -> 64 -> ``projection_dim`` (SmolLM2's n_embd, 576).
The weights mean nothing; what the tests check is that the pixels decide the embeddings that
enter the decode. About 190 KB.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

SMOLLM2_N_EMBD = 576
IMAGE_SIZE = 32
PATCH_SIZE = 8
N_IMAGE_TOKENS = (IMAGE_SIZE // PATCH_SIZE) ** 2  # what one image costs in the context
_N_EMBD = 32  # the ViT's width
_N_FF = 64
_N_HEAD = 2
_N_BLOCK = 2
_MM_HIDDEN = 64


def write_projector(path: Path, *, projection_dim: int = SMOLLM2_N_EMBD, seed: int = 0) -> Path:
    """Write the projector GGUF to ``path`` (its output dim ``projection_dim``) and return it."""
    import gguf

    rng = np.random.default_rng(seed)

    def rand(*shape: int, scale: float = 0.2) -> np.ndarray:
        # numpy shape is ggml's ne reversed: (rows, cols) is a matrix of ne [cols, rows]
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    w = gguf.GGUFWriter(str(path), "clip")
    w.add_string("general.name", "hearth-test-projector")
    w.add_string("general.description", "tiny random LLaVA-style projector for tests")
    w.add_string("clip.projector_type", "mlp")
    w.add_bool("clip.has_vision_encoder", True)
    w.add_bool("clip.use_gelu", True)
    w.add_uint32("clip.vision.image_size", IMAGE_SIZE)
    w.add_uint32("clip.vision.patch_size", PATCH_SIZE)
    w.add_uint32("clip.vision.embedding_length", _N_EMBD)
    w.add_uint32("clip.vision.feed_forward_length", _N_FF)
    w.add_uint32("clip.vision.block_count", _N_BLOCK)
    w.add_uint32("clip.vision.attention.head_count", _N_HEAD)
    w.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-5)
    w.add_uint32("clip.vision.projection_dim", projection_dim)
    w.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    w.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])

    # patch embedding: a conv of 8x8x3 -> n_embd (ggml ne [8, 8, 3, n_embd])
    w.add_tensor("v.patch_embd.weight", rand(_N_EMBD, 3, PATCH_SIZE, PATCH_SIZE, scale=0.1))
    w.add_tensor("v.patch_embd.bias", rand(_N_EMBD))
    w.add_tensor("v.position_embd.weight", rand(N_IMAGE_TOKENS, _N_EMBD))
    w.add_tensor("v.pre_ln.weight", np.ones(_N_EMBD, np.float32))
    w.add_tensor("v.pre_ln.bias", np.zeros(_N_EMBD, np.float32))
    for i in range(_N_BLOCK):
        p = f"v.blk.{i}"
        for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
            w.add_tensor(f"{p}.{name}.weight", rand(_N_EMBD, _N_EMBD))
            w.add_tensor(f"{p}.{name}.bias", rand(_N_EMBD, scale=0.02))
        for ln in ("ln1", "ln2"):
            w.add_tensor(f"{p}.{ln}.weight", np.ones(_N_EMBD, np.float32))
            w.add_tensor(f"{p}.{ln}.bias", np.zeros(_N_EMBD, np.float32))
        w.add_tensor(f"{p}.ffn_up.weight", rand(_N_FF, _N_EMBD))
        w.add_tensor(f"{p}.ffn_up.bias", rand(_N_FF, scale=0.02))
        w.add_tensor(f"{p}.ffn_down.weight", rand(_N_EMBD, _N_FF))
        w.add_tensor(f"{p}.ffn_down.bias", rand(_N_EMBD, scale=0.02))
    # LLaVA's projector: mm.0 (linear), GELU, mm.2 (linear) into the text model's space
    w.add_tensor("mm.0.weight", rand(_MM_HIDDEN, _N_EMBD))
    w.add_tensor("mm.0.bias", rand(_MM_HIDDEN, scale=0.02))
    w.add_tensor("mm.2.weight", rand(projection_dim, _MM_HIDDEN, scale=0.05))
    w.add_tensor("mm.2.bias", rand(projection_dim, scale=0.01))

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def image_rgb(seed: int, width: int = IMAGE_SIZE, height: int = IMAGE_SIZE) -> bytes:
    """Seeded random RGB8 pixels (row-major, width*height*3 bytes)."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, size=width * height * 3, dtype=np.uint8).tobytes()
