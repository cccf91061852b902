"""Model formats: one object per format (``GGUF``, ``MLX``) that the Hub catalog, the downloads,
the fit estimate and the library ask instead of branching on the format's name.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from app.core.library import fit as fitlib
from app.core.library.formats.base import (
    HeaderReader,
    HubFormat,
    ModelFormat,
    ModelOption,
    Offer,
    RepoFile,
    format_named,
    partial_of,
)
from app.core.library.formats.gguf_files import GGUF, SHARD_RE, GgufFormat, group_gguf, quant_of
from app.core.library.formats.mlx_folder import (
    MLX,
    MlxFormat,
    local_remote_code,
    mlx_files,
    remote_code_reason,
)
from app.core.library.formats.whisper_folder import WHISPER, WhisperFormat, is_whisper_folder

# detection order: a repo with any .gguf file is a GGUF repo, even if it is tagged mlx
FORMATS: tuple[ModelFormat, ...] = (GGUF, MLX, WHISPER)

__all__ = [
    "FORMATS",
    "GGUF",
    "MLX",
    "SHARD_RE",
    "GgufFormat",
    "HeaderReader",
    "HubFormat",
    "MlxFormat",
    "ModelFormat",
    "ModelOption",
    "Offer",
    "RepoFile",
    "WHISPER",
    "WhisperFormat",
    "describe",
    "estimate_model",
    "format_named",
    "group_gguf",
    "is_whisper_folder",
    "local_remote_code",
    "mlx_files",
    "partial_of",
    "quant_of",
    "remote_code_reason",
    "repo_format",
    "tagged_format",
]


def repo_format(
    names: Sequence[str], tags: Sequence[str], library_name: str | None
) -> ModelFormat | None:
    """The format of a repo from its file names (any case), tags and library; None: neither."""
    lower = [n.lower() for n in names]
    return next((f for f in FORMATS if f.matches_repo(lower, tags, library_name)), None)


def tagged_format(tags: Sequence[str], library_name: str | None) -> ModelFormat | None:
    """The format a search result's tags claim (search answers list no files)."""
    return next((f for f in FORMATS if f.tagged(tags, library_name)), None)


def describe(path: Path, *, format: str | None = None) -> dict[str, Any]:
    """Validate a model file or folder and read its metadata: a folder with ``model.bin`` is
    Whisper (CTranslate2), another folder MLX, a file GGUF.

    ``format``: the format the caller knows the file has (an Ollama blob: a GGUF without suffix).

    Raises:
        InvalidModel: not a GGUF file, MLX or Whisper folder, or its header is malformed.
    """
    fmt: ModelFormat = GGUF
    if path.is_dir():
        fmt = WHISPER if (path / "model.bin").is_file() else MLX
    return fmt.describe(path, declared=format == fmt.name)


def estimate_model(model: Any, options: Any) -> fitlib.MemoryEstimate:
    """Estimate for a library model (``LocalModel``) loaded with ``options`` (``LoadOptions``)."""
    return format_named(model.format).estimate_local(model, options)
