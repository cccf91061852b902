"""Which token texts and GGUF keys mark fill-in-the-middle, and whether a GGUF file's model
has them: the library's check before any load (its ``fim`` capability). The runtime's ids and
the prompt built from them: app/core/inference/fim.
Tested by tests/core/library/test_fim_vocab.py."""

from __future__ import annotations

from collections.abc import Iterable

ROLES = ("pre", "suf", "mid", "pad", "rep", "sep")

# Each role's token texts by family (llama.cpp's llama-vocab.cpp list, plus StarCoder2's
# <file_sep>): Qwen2.5/3-Coder, StarCoder/Granite/SmolLM, DeepSeek-Coder, CodeLlama, GLM-4.5,
# Falcon-H1-Tiny-Coder. Codestral's [SUFFIX]/[PREFIX] has no middle token: not this scheme.
TEXTS: dict[str, tuple[str, ...]] = {
    "pre": (
        "<|fim_prefix|>",
        "<fim-prefix>",
        "<fim_prefix>",
        "<｜fim▁begin｜>",
        "<PRE>",
        "▁<PRE>",
        "<|code_prefix|>",
        "<|prefix|>",
    ),
    "suf": (
        "<|fim_suffix|>",
        "<fim-suffix>",
        "<fim_suffix>",
        "<｜fim▁hole｜>",
        "<SUF>",
        "▁<SUF>",
        "<|code_suffix|>",
        "<|suffix|>",
    ),
    "mid": (
        "<|fim_middle|>",
        "<fim-middle>",
        "<fim_middle>",
        "<｜fim▁end｜>",
        "<MID>",
        "▁<MID>",
        "<|code_middle|>",
        "<|middle|>",
    ),
    "pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "▁<EOT>", "<EOT>"),
    "rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "sep": ("<|file_sep|>", "<file_sep>"),
}

# the GGUF keys a runtime reads each role from (llama-arch.cpp), newest first
GGUF_KEYS: dict[str, tuple[str, ...]] = {
    "pre": ("tokenizer.ggml.fim_pre_token_id", "tokenizer.ggml.prefix_token_id"),
    "suf": ("tokenizer.ggml.fim_suf_token_id", "tokenizer.ggml.suffix_token_id"),
    "mid": ("tokenizer.ggml.fim_mid_token_id", "tokenizer.ggml.middle_token_id"),
    "pad": ("tokenizer.ggml.fim_pad_token_id",),
    "rep": ("tokenizer.ggml.fim_rep_token_id",),
    "sep": ("tokenizer.ggml.fim_sep_token_id",),
}


def can_fill(metadata_keys: Iterable[str], tokens: Iterable[bytes]) -> bool:
    """Whether a model has prefix, suffix and middle markers: named by its GGUF keys, or as
    token texts of its vocabulary (``tokens``: the raw texts, read until all three are found)."""
    keys = set(metadata_keys)
    have = {role for role in ("pre", "suf", "mid") if any(k in keys for k in GGUF_KEYS[role])}
    wanted = {
        t.encode(): role for role in ("pre", "suf", "mid") if role not in have for t in TEXTS[role]
    }
    if wanted:
        for tok in tokens:
            role = wanted.get(bytes(tok))
            if role is not None:
                have.add(role)
                if len(have) == 3:
                    break
    return len(have) == 3
