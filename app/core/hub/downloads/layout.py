"""Where one download's files sit on disk, under the models folder (``owner/name/`` per repo).

- ``.FILE.partial``: bytes received so far; ``.TARGET.partial.json``: the plan (repo, commit,
  files, sizes, sha256) and the ETag each file's bytes came with, so a pull resumes after a quit
  or a crash; ``.TARGET.lock``: held while a process downloads (one download per file across
  processes).
- The format decides the rest (``app.core.library.formats``): GGUF files land beside each other and the
  first shard is renamed last; an MLX folder is assembled hidden and renamed whole.
Tested by tests/core/hub/test_downloads.py and tests/core/library/test_formats.py.
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import Any

from app.core.hub import check_repo_id
from app.core.library.formats import ModelFormat, RepoFile, format_named, partial_of
from app.core.util.fsutil import atomic_write_json
from app.errors import RepoRefused

from .plan import PullPlan

SIDECAR_VERSION = 1


class DiskLayout:
    """The paths of one plan's download and the file operations on them (blocking: run them in
    a thread from the loop)."""

    def __init__(self, models_dir: Path, plan: PullPlan) -> None:
        self.models_dir = models_dir
        self.plan = plan
        self.format: ModelFormat = format_named(plan.format)
        owner, name = check_repo_id(plan.repo_id).split("/")
        self.target = self.format.target(models_dir / owner / name, plan.files)

    # -- paths -----------------------------------------------------------------------------------
    @property
    def staging(self) -> Path:
        """Where the files land before install: beside the target (GGUF) or a hidden folder (MLX)."""
        return self.format.staging(self.target)

    def final(self, f: RepoFile) -> Path:
        return self.format.final(self.target, f)

    def partial(self, f: RepoFile) -> Path:
        return partial_of(self.final(f))

    @property
    def sidecar(self) -> Path:
        return self.target.parent / f".{self.target.name}.partial.json"

    @property
    def lock_path(self) -> Path:
        return self.target.parent / f".{self.target.name}.lock"

    @property
    def projector_lock_path(self) -> Path | None:
        """Held while the projector's bytes may be written: several quantizations of a repo
        share one projector file, so their downloads take turns on it."""
        f = self.plan.projector_file
        return None if f is None else self.final(f).parent / f".{self.final(f).name}.lock"

    # -- before the first byte -------------------------------------------------------------------
    def safe_dir(self, folder: Path) -> None:
        """Create ``folder`` under the models folder, refusing symlinks on the way."""
        root = self.models_dir
        root.mkdir(parents=True, exist_ok=True)
        rel = folder.relative_to(root)
        cur = root
        for part in rel.parts:
            cur = cur / part
            if cur.is_symlink():
                raise RepoRefused(f"refusing to write through a symlink: {cur}")
            with contextlib.suppress(FileExistsError):
                cur.mkdir()
            if cur.is_symlink() or not cur.is_dir():
                raise RepoRefused(f"refusing to write to {cur}: not a plain folder")
        if not folder.resolve().is_relative_to(root.resolve()):
            raise RepoRefused(f"refusing to write outside the models folder: {folder}")

    def prepare(self) -> None:
        """Create the folders and refuse any symlink where a file will be written."""
        self.safe_dir(self.target.parent)
        for folder in self.format.folders(self.target, self.plan.files):
            self.safe_dir(folder)
        for f in self.plan.files:
            final = self.final(f)
            check_not_symlink(partial_of(final))
            if final.is_symlink():
                raise RepoRefused(f"refusing to replace a symlink: {final}")
        for p in (self.sidecar, self.lock_path, self.projector_lock_path):
            if p is not None:
                check_not_symlink(p)

    # -- what is on disk -------------------------------------------------------------------------
    def installed(self) -> bool:
        """True when every file is already in place (a finished earlier pull)."""
        return self.format.installed(self.target, self.plan.files)

    def measure(self) -> dict[str, int]:
        """Bytes on disk per file: a ``.partial``'s length, or the whole size when verified."""
        have: dict[str, int] = {}
        for f in self.plan.files:
            final = self.final(f)
            part = partial_of(final)
            if part.exists():
                have[f.path] = min(part.lstat().st_size, f.size or 0)
            elif final.is_file() and final.stat().st_size == f.size:
                have[f.path] = f.size or 0
            else:
                have[f.path] = 0
        return have

    def install(self) -> None:
        """Rename the verified files into place (the format's order and shape).

        Raises:
            RepoRefused: the downloaded files must not be used; nothing of them is left.
        """
        try:
            self.format.install(self.target, self.plan.files)
        except RepoRefused:
            self.remove_sidecar()
            raise

    def discard(self, *, keep_projector: bool = False) -> None:
        """Delete this download's partial files (never a finished file outside staging);
        ``keep_projector``: another download holds the shared projector's file."""
        for f in self.plan.files:
            if keep_projector and f.path == self.plan.projector:
                continue
            with contextlib.suppress(FileNotFoundError):
                self.partial(f).unlink()
        self.format.discard(self.target)
        self.remove_sidecar()

    # -- the sidecar record ----------------------------------------------------------------------
    def write_sidecar(self) -> None:
        path = self.sidecar
        data: dict[str, Any] = {}
        with contextlib.suppress(OSError, ValueError):
            data = json.loads(path.read_text())
        if not isinstance(data, dict) or data.get("plan") != self.plan.to_dict():
            data = {"version": SIDECAR_VERSION, "plan": self.plan.to_dict(), "etags": {}}
        data["updated_at"] = time.time()
        atomic_write_json(path, data)

    def sidecar_etag(self, path: str, etag: str | None = None) -> str | None:
        """Read (or, with ``etag``, record) the ETag a file's partial bytes came with."""
        side = self.sidecar
        try:
            data = json.loads(side.read_text())
        except (OSError, ValueError):
            data = {"version": SIDECAR_VERSION, "plan": self.plan.to_dict(), "etags": {}}
        etags = data.setdefault("etags", {})
        if etag is None:
            v = etags.get(path)
            return v if isinstance(v, str) else None
        etags[path] = etag
        atomic_write_json(side, data)
        return etag

    def remove_sidecar(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.sidecar.unlink()


def check_not_symlink(p: Path) -> None:
    if p.is_symlink():
        raise RepoRefused(f"refusing to write through a symlink: {p}")
