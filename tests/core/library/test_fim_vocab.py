"""A GGUF file's model can fill in the middle when its keys or its vocabulary's texts name the
prefix, suffix and middle markers: the library says so (``fim``) before any load."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.core.library import gguf
from app.core.library.fim_vocab import can_fill
from app.core.library.formats.gguf_files import GGUF
from app.core.library.gguf_check import token_texts

pytestmark = pytest.mark.model


def _can_fill(path: Path) -> bool:
    h = gguf.read_header(path)
    return can_fill(h.metadata, token_texts(path, h))


def test_keys_or_texts_make_a_model_fill_in_the_middle(
    fim_gguf: Path, fim_texts_gguf: Path, smollm2_path: Path
) -> None:
    assert _can_fill(fim_gguf)
    assert _can_fill(fim_texts_gguf)
    # SmolLM2 has StarCoder's repository and file tokens, but no prefix/suffix/middle
    assert not _can_fill(smollm2_path)


def test_the_library_lists_fim_beside_completion_and_chat(
    fim_gguf: Path, smollm2_path: Path
) -> None:
    assert GGUF.describe(fim_gguf)["extra"]["fim"] is True
    assert GGUF.describe(smollm2_path)["extra"]["fim"] is False


def test_a_text_alone_is_not_enough() -> None:
    assert not can_fill([], [b"<fim_prefix>", b"<fim_suffix>"])
    assert can_fill([], [b"<fim_prefix>", b"x", b"<fim_suffix>", b"<fim_middle>"])
    assert can_fill(
        [
            "tokenizer.ggml.prefix_token_id",
            "tokenizer.ggml.suffix_token_id",
            "tokenizer.ggml.middle_token_id",
        ],
        [],
    )
