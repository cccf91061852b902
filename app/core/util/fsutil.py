"""Atomic, serialized writes for files that several Hearth processes share."""

from __future__ import annotations

import contextlib
import glob
import json
import logging
import os
import secrets
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

try:  # POSIX
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]
    import msvcrt

log = logging.getLogger(__name__)

# a temp file whose writer pid cannot be checked (Windows, or a name from before pids) is only
# removed once it is this old; an atomic write takes milliseconds
STALE_TEMP_AGE_S = 3600.0


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive advisory lock on ``path`` + ``.lock`` (blocks until free).

    The lock file is removed on release, so a clean stop leaves none behind.
    """
    lock_path = path.with_name(path.name + ".lock")
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    fd = _acquire(lock_path)
    try:
        yield
    finally:
        if fcntl is not None:
            # unlinked while still held: whoever opened the old file meanwhile sees it is no
            # longer the one at the path (in _acquire) and locks the next one instead
            with contextlib.suppress(OSError):
                os.unlink(lock_path)
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _acquire(lock_path: Path) -> int:
    while True:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            if fcntl is None:  # pragma: no cover - Windows never unlinks, so no check needed
                msvcrt.locking(fd, msvcrt.LK_LOCK, 1)
                return fd
            fcntl.flock(fd, fcntl.LOCK_EX)
            held = os.fstat(fd)
            try:
                now = os.stat(lock_path)
            except FileNotFoundError:
                now = None
            if now is not None and (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino):
                return fd
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # the previous holder removed this file: lock the one at the path now


def temp_path(path: Path, suffix: str = ".tmp") -> Path:
    """A sibling name for a temp file of ``path`` that carries this process's pid, so a
    leftover of a killed writer can be told from a write in progress."""
    return path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}{suffix}")


def _writer_gone(p: Path, now: float) -> bool:
    # names end in .PID.TOKEN.SUFFIX (temp_path); without a usable pid only age tells
    parts = p.name.rsplit(".", 3)
    pid = int(parts[1]) if len(parts) == 4 and parts[1].isdigit() else None
    if pid is None or os.name == "nt":  # os.kill(pid, 0) would terminate it on Windows
        try:
            return now - p.lstat().st_mtime > STALE_TEMP_AGE_S
        except OSError:
            return False
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # EPERM: alive, owned by another user
        return False
    return False  # alive (or its pid was reused: then kept until that process ends)


def remove_stale_temp_files(folder: Path, pattern: str) -> list[Path]:
    """Remove the temp files (or folders) matching ``pattern`` in ``folder`` whose writer is
    gone. Returns what was removed."""
    removed: list[Path] = []
    if not folder.is_dir():
        return removed
    now = time.time()
    for p in folder.glob(pattern):
        if not _writer_gone(p, now):
            continue
        try:
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink()
        except FileNotFoundError:
            continue  # another process cleaned it first
        except OSError as e:
            log.warning("could not remove the stale temp file %s: %s", p, e)
            continue
        log.info("removed a stale temp file %s", p)
        removed.append(p)
    return removed


def remove_stale_writes(path: Path) -> list[Path]:
    """Remove the leftovers of atomic writes of ``path`` that a kill interrupted."""
    return remove_stale_temp_files(path.parent, f".{glob.escape(path.name)}.*.tmp")


def atomic_write_bytes(path: Path, data: bytes, *, mode: int = 0o644) -> None:
    """Write ``data`` to ``path`` so a crash leaves either the old or the new file, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_writes(path)
    tmp = temp_path(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):  # make the rename itself durable
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


def atomic_write_json(path: Path, obj: Any, *, mode: int = 0o644) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode(), mode=mode)


def read_json(path: Path, default: Any) -> Any:
    """Read a JSON file; a missing file gives ``default``. A corrupt one raises ValueError."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return default
    return json.loads(raw)


def fsync_dir(path: Path) -> None:
    """Make renames in ``path`` durable (best effort: not every platform can)."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
