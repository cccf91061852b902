"""A GGUF file's model can fill in the middle when its keys or its vocabulary's texts name the
prefix, suffix and middle markers: the library says so (``fim``) before any load."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.core.library import gguf
from app.core.library.fim_vocab import can_fill
from app.core.library.formats.gguf_files import GGUF
from app.core.library.formats.mlx_folder import MLX
from app.core.library.gguf_check import token_texts

pytestmark = pytest.mark.model
STARCODER = ["<fim_prefix>", "<fim_middle>", "<fim_suffix>"]


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


@pytest.mark.parametrize(
    ("tokenizer", "config", "fills"),
    [
        # StarCoder's markers as added tokens
        ({"added_tokens": [{"id": i, "content": t} for i, t in enumerate(STARCODER)]}, {}, True),
        # only tokenizer_config.json's added_tokens_decoder names them
        (
            {},
            {"added_tokens_decoder": {str(i): {"content": t} for i, t in enumerate(STARCODER)}},
            True,
        ),
        # CodeLlama's are ordinary entries of the BPE vocabulary
        ({"model": {"vocab": {"▁<PRE>": 32007, "▁<SUF>": 32008, "▁<MID>": 32009}}}, {}, True),
        # a unigram vocabulary: [text, score] pairs
        ({"model": {"vocab": [["<fim_prefix>", 0.0], ["<fim_suffix>", 0.0]]}}, {}, False),
        ({"model": {"vocab": [[t, 0.0] for t in STARCODER]}}, {}, True),
        ({"added_tokens": [{"id": 0, "content": "<|im_start|>"}]}, {}, False),
    ],
)
def test_an_mlx_folders_tokenizer_files_say_whether_it_fills_in_the_middle(
    tmp_path: Path, tokenizer: dict, config: dict, fills: bool
) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (tmp_path / "model.safetensors").write_bytes(b"\0" * 8)
    (tmp_path / "tokenizer.json").write_text(json.dumps(tokenizer))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    assert MLX.describe(tmp_path)["extra"]["fim"] is fills
