"""What a download is: its plan (repo, commit, files, hashes) and the status snapshots it reports.
Tested by tests/core/library/test_projector.py."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Literal

from app.core.hub import ModelOption, RepoInfo, check_repo_id, check_repo_path
from app.core.library.formats import FORMATS, HubFormat, RepoFile, format_named
from app.core.library.projector import is_projector_name
from app.errors import RepoRefused

State = Literal[
    "queued",  # waiting for a download slot
    "waiting",  # another Hearth process is downloading the same file
    "downloading",
    "stalled",  # no bytes for the stall timeout: retrying after a backoff
    "retrying",  # the connection broke or the Hub answered 429/5xx: retrying after a backoff
    "verifying",  # re-hashing bytes on disk before resuming
    "paused",
    "completed",
    "failed",
    "cancelled",
]
ACTIVE: frozenset[str] = frozenset(
    {"queued", "waiting", "downloading", "stalled", "retrying", "verifying"}
)


@dataclass(frozen=True, slots=True)
class PullPlan:
    """What one download fetches: files of one repo at one commit, each with its expected hash."""

    repo_id: str
    revision: str
    format: HubFormat
    option: str  # the option's name: "Q4_K_M", a file stem, "mlx" or "ct2" (Whisper)
    quantization: str | None
    files: tuple[RepoFile, ...]  # the model's, then its vision projector's (when it has one)
    projector: str | None = None  # the projector's path among ``files``

    @classmethod
    def of(cls, info: RepoInfo, opt: ModelOption) -> PullPlan:
        """The plan for one option of a repo view, once every file can be verified.

        Raises:
            RepoRefused: the repo is refused, or a file has no size or checksum to verify.
        """
        if info.refused:
            raise RepoRefused(f"{info.id}: {info.refused}")
        if not any(
            o.name == opt.name and o.files == opt.files and o.projector == opt.projector
            for o in info.options
        ):
            raise RepoRefused(f"{info.id} does not offer {opt.name}")
        # the projector is fetched, verified and installed as one more file of the model
        files = opt.files + ((opt.projector,) if opt.projector else ())
        for f in files:
            check_repo_path(f.path)
            if f.size is None:
                raise RepoRefused(f"{info.id}: the Hub does not give the size of {f.path}")
            if not (f.sha256 or f.blob_id):
                raise RepoRefused(
                    f"{info.id}: the Hub gives no checksum for {f.path}, so it cannot be verified"
                )
            # weights (a Whisper folder's model.bin too) are verified by their LFS sha256
            if f.path.lower().endswith((".gguf", ".safetensors", ".bin")) and not f.sha256:
                raise RepoRefused(f"{info.id}: {f.path} is not in LFS (no sha256 to verify it)")
        projector = opt.projector.path if opt.projector else None
        return cls(info.id, info.revision, opt.format, opt.name, opt.quantization, files, projector)

    @property
    def model_files(self) -> tuple[RepoFile, ...]:
        """The model's own files (without the projector)."""
        return tuple(f for f in self.files if f.path != self.projector)

    @property
    def projector_file(self) -> RepoFile | None:
        return next((f for f in self.files if f.path == self.projector), None)

    @property
    def key(self) -> str:
        """The download id: the same files at the same commit are one download."""
        raw = json.dumps([self.repo_id, self.revision, [f.path for f in self.files]])
        return hashlib.sha256(raw.encode()).hexdigest()[:16]

    @property
    def total_bytes(self) -> int:
        return sum(f.size or 0 for f in self.files)

    @property
    def name(self) -> str:
        return format_named(self.format).download_name(self.repo_id, self.files)

    def source(self) -> dict[str, Any]:
        """Where a downloaded model came from, as the library records it."""
        return {
            "repo_id": self.repo_id,
            "revision": self.revision,
            "option": self.option,
            "files": [f.path for f in self.files],
            "sha256": {f.path: f.sha256 for f in self.files if f.sha256},
            "projector": self.projector,
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "repo_id": self.repo_id,
            "revision": self.revision,
            "format": self.format,
            "option": self.option,
            "quantization": self.quantization,
            "files": [
                {"path": f.path, "size": f.size, "sha256": f.sha256, "blob_id": f.blob_id}
                for f in self.files
            ],
            "projector": self.projector,
        }

    @classmethod
    def from_dict(cls, d: Any) -> PullPlan:
        """Rebuild a plan from a sidecar, checking every name and hash again (never trusted).

        Raises:
            ValueError, RepoRefused: the sidecar is malformed or hostile.
        """
        if not isinstance(d, dict) or not isinstance(d.get("files"), list) or not d["files"]:
            raise ValueError("not a download plan")
        files = []
        for f in d["files"]:
            if not isinstance(f, dict):
                raise ValueError("bad file entry")
            size, sha, blob = f.get("size"), f.get("sha256"), f.get("blob_id")
            if not isinstance(size, int) or size < 0:
                raise ValueError("bad size")
            if sha is not None and not (isinstance(sha, str) and len(sha) == 64):
                raise ValueError("bad sha256")
            if blob is not None and not (isinstance(blob, str) and len(blob) == 40):
                raise ValueError("bad blob id")
            files.append(RepoFile(check_repo_path(str(f.get("path") or "")), size, sha, blob))
        fmt = d.get("format")
        if fmt not in {f.name for f in FORMATS}:
            raise ValueError("bad format")
        rev = d.get("revision")
        if not isinstance(rev, str) or not rev or "/" in rev or ".." in rev:
            raise ValueError("bad revision")
        q = d.get("quantization")
        projector = d.get("projector")
        if projector is not None and (
            projector not in {f.path for f in files[1:]} or not is_projector_name(projector)
        ):
            raise ValueError("bad projector")
        return cls(
            repo_id=check_repo_id(d.get("repo_id", "")),
            revision=rev,
            format=fmt,
            option=str(d.get("option") or ""),
            quantization=q if isinstance(q, str) else None,
            files=tuple(files),
            projector=projector,
        )


@dataclass(frozen=True, slots=True)
class DownloadStatus:
    """A snapshot of one download, for lists, progress bars and the API."""

    id: str
    repo_id: str
    revision: str
    name: str
    option: str
    format: str
    files: tuple[str, ...]
    state: str
    bytes_done: int
    total_bytes: int
    speed_bps: float
    eta_s: float | None
    current_file: str | None
    attempt: int
    error: str | None
    error_code: str | None
    model_id: str | None
    started_at: float

    @property
    def finished(self) -> bool:
        return self.state in ("completed", "failed", "cancelled")

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "repo_id": self.repo_id,
            "revision": self.revision,
            "name": self.name,
            "option": self.option,
            "format": self.format,
            "files": list(self.files),
            "state": self.state,
            "bytes_done": self.bytes_done,
            "total_bytes": self.total_bytes,
            "speed_bps": round(self.speed_bps, 1),
            "eta_s": None if self.eta_s is None else round(self.eta_s, 1),
            "current_file": self.current_file,
            "attempt": self.attempt,
            "error": self.error,
            "error_code": self.error_code,
            "model_id": self.model_id,
        }
