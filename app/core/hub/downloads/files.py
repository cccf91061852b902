"""The files of a download on disk: the lock that makes one process download a file, the
running hash (the LFS sha256, or git's blob sha1 for small files), and the low-level writes.

Plain functions and small classes over ``os``; ``app.core.hub.downloads`` drives them.
Tested by tests/core/hub/test_downloads.py and tests/core/library/test_formats.py.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from app.core.library.formats.base import RepoFile

try:  # POSIX
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]
    import msvcrt

HASH_CHUNK = 4 * 1024 * 1024
NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
BINARY = getattr(os, "O_BINARY", 0)


def free_space(path: Path) -> int:
    """Free bytes on the filesystem holding ``path`` (or its nearest existing parent)."""
    p = path
    while not p.exists() and p != p.parent:
        p = p.parent
    return shutil.disk_usage(p).free


class Hasher:
    """sha256 for LFS files; git's blob sha1 for small files kept in git."""

    def __init__(self, spec: RepoFile) -> None:
        self.spec = spec
        self.reset()

    def reset(self) -> None:
        if self.spec.sha256:
            self.h = hashlib.sha256()
        else:
            self.h = hashlib.sha1(usedforsecurity=False)
            self.h.update(b"blob %d\0" % (self.spec.size or 0))

    def update(self, data: bytes) -> None:
        self.h.update(data)

    @property
    def expected(self) -> str:
        return (self.spec.sha256 or self.spec.blob_id or "").lower()

    def matches(self) -> bool:
        return self.h.hexdigest() == self.expected


class FileLock:
    """A non-blocking exclusive lock on a small file next to the download (flock / msvcrt)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd: int | None = None

    def try_acquire(self) -> bool:
        """Take the lock if no other process holds it (never blocks)."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | NOFOLLOW, 0o644)
        try:
            if fcntl is not None:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            else:  # pragma: no cover
                msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
        except OSError:
            os.close(fd)
            return False
        self.fd = fd
        return True

    def release(self, *, unlink: bool = False) -> None:
        """Let go; ``unlink`` also removes the lock file (the download is finished)."""
        if self.fd is None:
            return
        if unlink:  # a waiter that then locks the unlinked file re-checks for the finished file
            with contextlib.suppress(OSError):
                self.path.unlink()
        with contextlib.suppress(OSError):
            if fcntl is not None:
                fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)
        self.fd = None


def disk_full(e: OSError) -> bool:
    """True for the errors of a full disk or an exhausted quota."""
    return e.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", -1))


def write_all(fd: int, data: bytes, hasher: Hasher) -> None:
    """Write every byte of ``data`` at ``fd``'s offset, then add it to the running hash."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]
    hasher.update(data)


def hash_prefix(path: Path, n: int, hasher: Hasher) -> None:
    """Feed the first ``n`` bytes of ``path`` to ``hasher`` (re-hashing a partial file).

    Raises:
        OSError: unreadable, or shorter than ``n``.
    """
    with open(path, "rb") as f:
        left = n
        while left:
            chunk = f.read(min(HASH_CHUNK, left))
            if not chunk:
                raise OSError(errno.EIO, f"{path} is shorter than expected")
            hasher.update(chunk)
            left -= len(chunk)


def truncate(path: Path) -> None:
    """Empty ``path`` (created if missing; never through a symlink)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | NOFOLLOW, 0o644)
    os.close(fd)


def unlink_quiet(path: Path) -> None:
    """Delete ``path`` if it exists."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
