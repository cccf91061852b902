"""Whisper in CTranslate2's format (faster-whisper): a folder with ``config.json``,
``model.bin`` and the tokenizer (``tokenizer.json``, or ``vocabulary.txt`` /
``vocabulary.json``). Laid out on disk like an MLX folder; on the Hub, a repo tagged
``ctranslate2`` (as a tag or its library) and as speech recognition (``faster-whisper-*``) offers
its folder as one option, "ct2". ``model.bin`` is CTranslate2's own binary, read by its C++
loader: no pickle, no code from the repo.
Tested by tests/core/library/test_whisper_folder.py and tests/core/hub/test_whisper_hub.py.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from app.core.library import fit as fitlib
from app.core.library.formats.base import HeaderReader, ModelOption, Offer, RepoFile, register
from app.core.library.formats.mlx_folder import MlxFormat, remote_code_reason
from app.errors import InvalidModel

TOKENIZER_FILES = ("tokenizer.json", "vocabulary.txt", "vocabulary.json")
# what faster-whisper reads from a folder (preprocessor_config.json: the mel bins of
# large-v3); READMEs, images, .gitattributes and any other weights stay on the Hub
WHISPER_FILES = ("config.json", "model.bin", "preprocessor_config.json", *TOKENIZER_FILES)
# a ctranslate2 repo is Whisper when tagged as speech recognition (or whisper) too: CTranslate2
# also converts translation models and LLMs into the same model.bin layout
SPEECH_TAGS = ("automatic-speech-recognition", "whisper")
OPTION_NAME = "ct2"
# Whisper's decoder reads at most 448 tokens (its text context): what listings show
WHISPER_TEXT_CONTEXT = 448
# working memory beside the weights: the 30-s window's mel features and encoder activations,
# the beam's decoder cache, and the decoded audio of a long file (1 h of 16 kHz float32 is
# 230 MB): a quarter of the weights, at least 256 MiB
WORKING_MIN = 256 * 1024 * 1024


def is_whisper_folder(p: Path) -> bool:
    return (
        p.is_dir()
        and (p / "config.json").is_file()
        and (p / "model.bin").is_file()
        and any((p / name).is_file() for name in TOKENIZER_FILES)
    )


def estimate_whisper(weights: int) -> fitlib.MemoryEstimate:
    """model.bin's size, plus a quarter of it (at least 256 MiB) for the work."""
    return fitlib.MemoryEstimate(
        weights, 0, max(WORKING_MIN, weights // 4), 0, WHISPER_TEXT_CONTEXT
    )


class WhisperFormat(MlxFormat):
    """CTranslate2 Whisper folders, served by faster-whisper (``app/runtimes/speech``)."""

    name = "whisper"
    label = "Whisper (CTranslate2)"

    search_tags = ("ctranslate2", "automatic-speech-recognition")
    option_heading = "Folder"

    # -- the Hub ---------------------------------------------------------------------------------
    def tagged(self, tags: Sequence[str], library_name: str | None) -> bool:
        ct2 = library_name == "ctranslate2" or "ctranslate2" in tags
        return ct2 and any(t in tags for t in SPEECH_TAGS)

    def matches_repo(
        self, names: Sequence[str], tags: Sequence[str], library_name: str | None
    ) -> bool:
        return (
            self.tagged(tags, library_name)
            and "config.json" in names
            and "model.bin" in names
            and any(n in names for n in TOKENIZER_FILES)
        )

    def offer(self, files: Sequence[RepoFile], *, config: Any, tags: Sequence[str]) -> Offer:
        why = remote_code_reason(config, tags)
        if why:
            return Offer((), f"refusing this Whisper repo: {why}")
        chosen = tuple(f for f in files if f.path in WHISPER_FILES)
        size = sum(f.size or 0 for f in chosen)
        return Offer((ModelOption(OPTION_NAME, "whisper", None, chosen, size),), None)

    def option_label(self, repo_id: str, option: ModelOption) -> str:
        return f"{repo_id.rsplit('/', 1)[-1]}/ (Whisper folder, speech to text)"

    async def estimate_remote(
        self, option: ModelOption, read_header: HeaderReader, *, context_length: int
    ) -> fitlib.MemoryEstimate:
        weights = next((f.size for f in option.files if f.path == "model.bin"), None)
        return estimate_whisper(weights if weights is not None else option.size_bytes)

    # -- the library -----------------------------------------------------------------------------
    def describe(self, path: Path, *, declared: bool = False) -> dict[str, Any]:
        if not is_whisper_folder(path):
            raise InvalidModel(
                f"{path} is not a Whisper model folder (needs config.json, model.bin and "
                "tokenizer.json or vocabulary.txt)"
            )
        try:
            cfg = json.loads((path / "config.json").read_text())
        except (OSError, ValueError) as e:
            raise InvalidModel(f"{path}/config.json is unreadable: {e}") from e
        if not isinstance(cfg, dict):
            raise InvalidModel(f"{path}/config.json is not an object")
        why = remote_code_reason(cfg)
        if why:
            raise InvalidModel(f"refusing {path.name}: {why}")
        size = sum(f.stat().st_size for f in path.iterdir() if f.is_file())
        langs = cfg.get("lang_ids")
        return {
            "format": self.name,
            "size_bytes": size,
            "architecture": "whisper",
            "name": path.name,
            "parameters": None,
            "quantization": None,
            "context_length": WHISPER_TEXT_CONTEXT,
            "chat_template": None,
            # an English-only model (tiny.en...) has no language tokens
            "extra": {"multilingual": isinstance(langs, list) and len(langs) > 1},
        }

    def estimate_local(self, model: Any, options: Any) -> fitlib.MemoryEstimate:
        try:
            weights = (Path(model.path) / "model.bin").stat().st_size
        except OSError:
            weights = model.size_bytes
        return estimate_whisper(weights)


WHISPER = register(WhisperFormat())
