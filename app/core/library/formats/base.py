"""What every model format answers, and the two records it answers about: a repo file and an option.

A format (``GgufFormat``, ``MlxFormat``) is one object that knows, for its kind of model, how to
recognise a repo, what to offer from it, where a download lands and when it is complete, how
its memory is estimated and how the library reads it. Callers ask the object; nobody else
branches on the format's name.
Tested by tests/core/library/test_formats.py and tests/core/library/test_projector.py.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from app.core.library import fit as fitlib
    from app.core.library.gguf import GGUFHeader

HubFormat = Literal["gguf", "mlx", "whisper"]


@dataclass(frozen=True, slots=True)
class RepoFile:
    """One file of a repo as the Hub's API lists it."""

    path: str
    size: int | None
    sha256: str | None  # the LFS oid: what the downloaded bytes must hash to
    blob_id: str | None  # the git blob sha1 (files not in LFS are verified with it)

    @property
    def lfs(self) -> bool:
        return self.sha256 is not None

    @property
    def basename(self) -> str:
        return self.path.rsplit("/", 1)[-1]


@dataclass(frozen=True, slots=True)
class ModelOption:
    """One thing a repo offers: a GGUF quantization (one file or all shards), an MLX or a
    Whisper folder."""

    name: str  # "Q4_K_M", or the file stem when the name carries no quantization; "mlx"; "ct2"
    format: HubFormat
    quantization: str | None
    files: tuple[RepoFile, ...]
    size_bytes: int
    fit: fitlib.Fit | None = None  # None until estimated (or when the header could not be read)
    estimate: fitlib.MemoryEstimate | None = None
    fit_error: str | None = None
    # a GGUF model's vision projector (mmproj), fetched with it; size_bytes includes it
    projector: RepoFile | None = None

    @property
    def first_file(self) -> RepoFile:
        return self.files[0]

    @property
    def model_bytes(self) -> int:
        """The model's own files, without the projector."""
        return self.size_bytes - (self.projector.size or 0 if self.projector else 0)

    @property
    def sharded(self) -> bool:
        return format_named(self.format).sharded(self.files)

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "format": self.format,
            "quantization": self.quantization,
            "files": [f.path for f in self.files],
            "size_bytes": self.size_bytes,
            "fit": self.fit,
            "memory_bytes": self.estimate.total if self.estimate else None,
            "fit_error": self.fit_error,
            "projector": (
                {"file": self.projector.path, "size": self.projector.size}
                if self.projector
                else None
            ),
        }


@dataclass(frozen=True, slots=True)
class Offer:
    """What a format offers from a repo's files: options, or why nothing; notes for the log."""

    options: tuple[ModelOption, ...]
    refused: str | None
    notes: tuple[str, ...] = ()


HeaderReader = Callable[[RepoFile], Awaitable["GGUFHeader"]]


class ModelFormat(ABC):
    """One model format's answers. Subclasses are stateless singletons (see ``formats.FORMATS``)."""

    name: HubFormat
    label: str  # what a person calls it: "GGUF", "MLX"
    option_heading: str  # the column an option's name sits in: "Quantization", "Folder"
    # the Hub's search filter for repos of this format (a repo must carry every tag)
    search_tags: tuple[str, ...]

    # -- the Hub ---------------------------------------------------------------------------------
    @abstractmethod
    def tagged(self, tags: Sequence[str], library_name: str | None) -> bool:
        """Whether a search result (tags only, no file list) is a repo of this format."""

    @abstractmethod
    def matches_repo(
        self, names: Sequence[str], tags: Sequence[str], library_name: str | None
    ) -> bool:
        """Whether a repo with these (lowercased) file names is a model of this format."""

    @abstractmethod
    def offer(self, files: Sequence[RepoFile], *, config: Any, tags: Sequence[str]) -> Offer:
        """The options a repo of this format offers (what each download fetches)."""

    @abstractmethod
    def sharded(self, files: Sequence[RepoFile]) -> bool:
        """Whether these files are the shards of one model file."""

    @abstractmethod
    def option_label(self, repo_id: str, option: ModelOption) -> str:
        """How a list names an option of this format."""

    @abstractmethod
    async def estimate_remote(
        self, option: ModelOption, read_header: HeaderReader, *, context_length: int
    ) -> fitlib.MemoryEstimate:
        """Memory estimate for an option before downloading it (``read_header``: over HTTP)."""

    # -- the download on disk --------------------------------------------------------------------
    @abstractmethod
    def download_name(self, repo_id: str, files: Sequence[RepoFile]) -> str:
        """The name a download shows (the file, or the folder)."""

    @abstractmethod
    def target(self, repo_dir: Path, files: Sequence[RepoFile]) -> Path:
        """The file (first shard) or folder the library will list, under ``repo_dir``."""

    @abstractmethod
    def staging(self, target: Path) -> Path:
        """The folder files land in before the install."""

    @abstractmethod
    def final(self, target: Path, file: RepoFile) -> Path:
        """Where one verified file is renamed to (its ``.partial`` sits beside it)."""

    @abstractmethod
    def folders(self, target: Path, files: Sequence[RepoFile]) -> list[Path]:
        """Folders to create, parents first, before any byte is written (beyond ``target.parent``)."""

    @abstractmethod
    def installed(self, target: Path, files: Sequence[RepoFile]) -> bool:
        """True when every file is already in place (a finished earlier pull)."""

    @abstractmethod
    def install(self, target: Path, files: Sequence[RepoFile]) -> None:
        """Rename the verified ``.partial`` files into place so the library sees them.

        Raises:
            RepoRefused: what was downloaded must not be used (its staging is removed).
        """

    @abstractmethod
    def discard(self, target: Path) -> None:
        """Remove what is left of a stopped download beyond its ``.partial`` files."""

    # -- the library -----------------------------------------------------------------------------
    @abstractmethod
    def describe(self, path: Path, *, declared: bool = False) -> dict[str, Any]:
        """Validate a local file or folder of this format and read its metadata.

        ``declared``: the caller knows the format (an Ollama blob has no ``.gguf`` suffix).

        Raises:
            InvalidModel: not a model of this format, or its metadata is malformed.
        """

    @abstractmethod
    def estimate_local(self, model: Any, options: Any) -> fitlib.MemoryEstimate:
        """Memory estimate for a library model (``LocalModel``) with ``options`` (``LoadOptions``)."""


_REGISTRY: dict[str, ModelFormat] = {}


def register(fmt: ModelFormat) -> ModelFormat:
    """Make ``fmt`` the answer for its name (each format module registers its one object)."""
    _REGISTRY[fmt.name] = fmt
    return fmt


def format_named(name: str) -> ModelFormat:
    """The format object for ``"gguf"``, ``"mlx"`` or ``"whisper"``.

    Raises:
        KeyError: no such format.
    """
    return _REGISTRY[name]


def partial_of(final: Path) -> Path:
    """Where a file's bytes are received before it is verified and renamed."""
    return final.parent / f".{final.name}.partial"
