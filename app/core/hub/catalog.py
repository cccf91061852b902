"""The catalog, pure: what a repo is, what can be pulled from it, which option a pull means.

Nothing here talks to the network; ``HubClient`` fills these records in. What a repo offers is
its format's answer (``app.core.library.formats``).
Tested by tests/core/hub/test_client.py and tests/core/hub/test_offline.py.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from app.core.hub.refs import REPO_ID_RE, check_repo_path, shown
from app.core.library.formats import (
    HubFormat,
    ModelOption,
    RepoFile,
    group_gguf,
    mlx_files,
    remote_code_reason,
    repo_format,
)
from app.core.library.formats.mlx_folder import MLX_SKIP, MLX_SUFFIXES
from app.errors import AmbiguousChoice, RepoNotFound, RepoRefused

__all__ = [
    "DEFAULT_QUANT",
    "MLX_SKIP",
    "MLX_SUFFIXES",
    "PICKLE_SUFFIXES",
    "SEARCH_EXPAND",
    "SORT_PARAMS",
    "HubFormat",
    "ModelOption",
    "ModelSummary",
    "RepoFile",
    "RepoInfo",
    "Sort",
    "assess",
    "canonical_id",
    "choices",
    "choose",
    "group_gguf",
    "license_of",
    "mlx_files",
    "remote_code_reason",
    "size_range",
]

Sort = Literal["downloads", "likes", "recent", "created"]
SORT_PARAMS: dict[str, str] = {
    "downloads": "downloads",
    "likes": "likes",
    "recent": "last_modified",
    "created": "created_at",
}
SEARCH_EXPAND = [
    "author",
    "downloads",
    "likes",
    "lastModified",
    "createdAt",
    "gated",
    "private",
    "tags",
    "library_name",
    "pipeline_tag",
]
DEFAULT_QUANT = "Q4_K_M"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")


@dataclass(frozen=True, slots=True)
class ModelSummary:
    """A search result: what the Discover list shows per repo."""

    id: str
    author: str | None
    downloads: int
    likes: int
    last_modified: datetime | None
    created_at: datetime | None
    gated: bool | str  # False, "auto" or "manual"
    private: bool
    license: str | None
    tags: tuple[str, ...]
    library_name: str | None
    pipeline_tag: str | None
    format: HubFormat | None
    # (smallest, largest) option in bytes; None until the repo's files are read: the Hub's
    # search answer lists file names at most, never their sizes
    size_range: tuple[int, int] | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "author": self.author,
            "downloads": self.downloads,
            "likes": self.likes,
            "last_modified": self.last_modified.isoformat() if self.last_modified else None,
            "created_at": self.created_at.isoformat() if self.created_at else None,
            "gated": self.gated,
            "private": self.private,
            "license": self.license,
            "format": self.format,
            "pipeline_tag": self.pipeline_tag,
            "tags": list(self.tags),
            "size_range": list(self.size_range) if self.size_range else None,
        }


@dataclass(frozen=True, slots=True)
class RepoInfo:
    """One repo, assessed: its files, what can be pulled from it, or why it is refused."""

    id: str
    revision: str  # the commit every download of this view uses
    author: str | None
    format: HubFormat | None
    gated: bool | str
    private: bool
    license: str | None
    downloads: int
    likes: int
    last_modified: datetime | None
    created_at: datetime | None
    tags: tuple[str, ...]
    library_name: str | None
    files: tuple[RepoFile, ...]
    options: tuple[ModelOption, ...]
    refused: str | None  # why Hearth will not download from this repo (None: it will)
    url: str
    warnings: tuple[str, ...] = ()
    card_data: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @property
    def size_range(self) -> tuple[int, int] | None:
        """The smallest and largest option in bytes (see ``size_range``)."""
        return size_range(self.options)

    def option(self, name: str) -> ModelOption:
        for o in self.options:
            if o.name == name:
                return o
        raise KeyError(name)

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "revision": self.revision,
            "author": self.author,
            "format": self.format,
            "gated": self.gated,
            "private": self.private,
            "license": self.license,
            "downloads": self.downloads,
            "likes": self.likes,
            "last_modified": self.last_modified.isoformat() if self.last_modified else None,
            "url": self.url,
            "refused": self.refused,
            "warnings": list(self.warnings),
            "options": [o.as_dict() for o in self.options],
        }


def license_of(tags: Iterable[str], card: Any) -> str | None:
    lic = card.get("license") if isinstance(card, dict) else None
    if isinstance(lic, str):
        return lic
    for t in tags:
        if t.startswith("license:"):
            return t.split(":", 1)[1]
    return None


def assess(
    files: Sequence[RepoFile],
    *,
    tags: Sequence[str] = (),
    library_name: str | None = None,
    config: Any = None,
    unsafe: Sequence[str] = (),
) -> tuple[HubFormat | None, list[ModelOption], str | None, list[str]]:
    """Decide what can be pulled from a repo. Returns (format, options, refusal, warnings)."""
    names = [f.path for f in files]
    warnings = [f"skipped an unsafe file name: {shown(n)}" for n in unsafe]
    fmt = repo_format(names, tags, library_name)
    lower = [n.lower() for n in names]
    if fmt is None:
        if any(n.endswith(PICKLE_SUFFIXES) for n in lower) and not any(
            n.endswith((".safetensors", ".gguf")) for n in lower
        ):
            return (
                None,
                [],
                (
                    "this repo has only pickle weights (.bin/.pt/.pth/.pkl/.ckpt), which can run code "
                    "when loaded; Hearth downloads GGUF files, MLX safetensors and CTranslate2 Whisper "
                    "folders only"
                ),
                warnings,
            )
        if unsafe and any(str(n).lower().endswith(".gguf") for n in unsafe):
            return None, [], "every GGUF file in this repo has an unsafe name", warnings
        why = "this repo has no GGUF files and is not an MLX or Whisper (CTranslate2) model"
        return None, [], why, warnings
    offer = fmt.offer(files, config=config, tags=tags)
    warnings.extend(offer.notes)
    return fmt.name, list(offer.options), offer.refused, warnings


def size_range(options: Iterable[ModelOption]) -> tuple[int, int] | None:
    """(smallest, largest) download among a repo's options, in bytes: per GGUF quantization
    (a sharded one counts as the sum of its shards), the whole folder for MLX. Options with a
    file of unknown size are left out; None when nothing is left.
    """
    sizes = [o.size_bytes for o in options if o.files and all(f.size is not None for f in o.files)]
    return (min(sizes), max(sizes)) if sizes else None


def choose(info: RepoInfo, *, quant: str | None = None, filename: str | None = None) -> ModelOption:
    """The option a pull means: a named file, a quantization (case-insensitive), Q4_K_M, or the
    only one there is.

    Raises:
        RepoRefused: the repo is refused.
        RepoNotFound: the named file is not a model in this repo.
        AmbiguousChoice: several options and nothing says which (``choices`` lists them).
    """
    if info.refused:
        raise RepoRefused(f"{info.id}: {info.refused}")
    if filename:
        check_repo_path(filename)
        for o in info.options:
            if any(f.path == filename for f in o.files):
                return o
        raise RepoNotFound(f"{info.id} has no model file '{filename}'", param="model")
    if quant:
        want = quant.upper()
        hits = [o for o in info.options if (o.quantization or "").upper() == want]
        hits = hits or [o for o in info.options if o.name.upper() == want]
        if len(hits) == 1:
            return hits[0]
        if not hits:
            raise AmbiguousChoice(
                f"{info.id} has no {quant} file. Choose one of: "
                + ", ".join(o.name for o in info.options),
                choices=choices(info),
            )
        raise AmbiguousChoice(
            f"{info.id} has several {quant} files; name one with {info.id}/FILE",
            choices=[f"{info.id}/{o.first_file.path}" for o in hits],
        )
    if len(info.options) == 1:
        return info.options[0]
    default = [o for o in info.options if o.quantization == DEFAULT_QUANT]
    if len(default) == 1:
        return default[0]
    raise AmbiguousChoice(
        f"{info.id} has {len(info.options)} model files; choose one with {info.id}:QUANT",
        choices=choices(info),
    )


def choices(info: RepoInfo) -> list[str]:
    return [f"{info.id}:{o.name}" for o in info.options]


def canonical_id(asked: str, answered: Any) -> str:
    """The Hub's spelling of the repo id (it fixes case), only when it names the same repo."""
    if (
        isinstance(answered, str)
        and answered.lower() == asked.lower()
        and REPO_ID_RE.match(answered)
    ):
        return answered
    return asked
