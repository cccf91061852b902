"""Test helper: SmolLM2 (a real model) made a fill-in-the-middle model. SmolLM2's vocabulary
has StarCoder's control tokens but no FIM markers; the copy either names four of its control
tokens in the ``tokenizer.ggml.fim_*_token_id`` keys, or renames them to StarCoder's FIM texts
(``<fim_prefix>``...) so only the texts say what they are. Every other key and tensor is
copied as it is."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from tests.support.gguf_rewrite import rewrite_gguf

# SmolLM2's control tokens used as the markers: <gh_stars>, <issue_start>, <issue_comment>,
# <empty_output>; <repo_name> and <file_sep> as they are
FIM_IDS = {"pre": 7, "suf": 8, "mid": 9, "pad": 16, "rep": 3, "sep": 5}
TEXTS = {7: "<fim_prefix>", 8: "<fim_suffix>", 9: "<fim_middle>", 16: "<fim_pad>"}


def write_fim_copy(src: Path, dst: Path, how: Literal["keys", "texts"]) -> Path:
    """A copy of ``src`` whose FIM tokens its metadata keys name (``keys``) or whose vocabulary
    spells them (``texts``)."""

    def value(name: str, v: Any) -> Any:
        if name == "tokenizer.ggml.tokens" and how == "texts":
            return [TEXTS.get(i, t) for i, t in enumerate(v)]
        return v

    def keys(_reader: Any, writer: Any) -> None:
        if how == "keys":
            for role, tok in FIM_IDS.items():
                writer.add_uint32(f"tokenizer.ggml.fim_{role}_token_id", tok)

    return rewrite_gguf(src, dst, value=value, add=keys)
