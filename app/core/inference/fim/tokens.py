"""A model's fill-in-the-middle tokens: the ids the runtime read from the GGUF's
``tokenizer.ggml.fim_*_token_id`` keys (and the older ``prefix/suffix/middle_token_id``), else
the token texts the code-model families use, where the vocabulary has them as single tokens.
Tested by tests/core/inference/fim/test_tokens.py."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from app.core.types import LoadedModel
from app.errors import InvalidRequest

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


@dataclass(frozen=True, slots=True)
class FimTokens:
    """The token ids a FIM prompt is built from: prefix, suffix and middle markers always;
    padding, repository name and file separator where the model has them."""

    pre: int
    suf: int
    mid: int
    pad: int | None = None
    rep: int | None = None
    sep: int | None = None


def _stated(special: dict[str, object], role: str) -> int | None:
    v = special.get(f"fim_{role}_id")
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


def _by_text(lm: LoadedModel, role: str) -> int | None:
    """The first of the role's texts that the vocabulary holds as one token spelled so."""
    for text in TEXTS[role]:
        ids = lm.tokenize(text, add_special=False, parse_special=True)
        if len(ids) != 1:
            continue
        [piece] = lm.token_pieces(ids)
        if piece in (text, text.replace("▁", " ")):
            return ids[0]
    return None


def find_fim_tokens(lm: LoadedModel) -> FimTokens | None:
    """The model's FIM tokens, or None when it lacks a prefix, suffix or middle token.

    The ids its runtime states (``special_tokens["fim_pre_id"]``...: the GGUF keys, and what
    llama.cpp found by text) come first; a role still missing is looked up by its texts."""
    special = lm.special_tokens
    found: dict[str, int | None] = {}
    for role in ROLES:
        found[role] = _stated(special, role)
        if found[role] is None:
            found[role] = _by_text(lm, role)
    pre, suf, mid = found["pre"], found["suf"], found["mid"]
    if pre is None or suf is None or mid is None:
        return None
    return FimTokens(pre, suf, mid, found["pad"], found["rep"], found["sep"])


def require_fim(lm: LoadedModel, model_id: str, param: str) -> FimTokens:
    """The model's FIM tokens, or a 400 naming ``param`` that says the model has none.

    Raises:
        InvalidRequest: an embedding or reranking model, or a model without FIM tokens.
    """
    if "completion" not in lm.capabilities:
        raise InvalidRequest(
            f"'{model_id}' is an embedding model: it cannot fill in the middle", param=param
        )
    fim = find_fim_tokens(lm)
    if fim is None:
        raise InvalidRequest(
            f"'{model_id}' has no fill-in-the-middle tokens (prefix, suffix and middle), so it "
            f"cannot complete between a prefix and a suffix; use a code model trained for it "
            f"(Qwen2.5-Coder, StarCoder2, CodeLlama, DeepSeek-Coder...)",
            param=param,
        )
    return fim


def has_fim_texts(metadata_keys: Iterable[str], tokens: Iterable[bytes]) -> bool:
    """Whether a GGUF file's model can fill in the middle, from its metadata keys and its
    vocabulary's token texts (the library's check, before any load)."""
    keys = set(metadata_keys)
    have = {role for role in ("pre", "suf", "mid") if any(k in keys for k in GGUF_KEYS[role])}
    wanted: dict[bytes, str] = {
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

