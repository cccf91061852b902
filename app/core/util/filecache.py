"""The parsed content of a file several processes share (settings, the library index), kept in
memory so that a request never reads it: one ``stat`` at most every ``CHECK_INTERVAL_S`` tells
whether another process replaced it (every writer replaces it atomically, so its inode changes).
Tested by tests/server/test_disk_reads.py and tests/server/edge/test_vision.py."""

from __future__ import annotations

import math
import os
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any, Generic, TypeVar

T = TypeVar("T")

CHECK_INTERVAL_S = 1.0

Signature = tuple[int, int, int, int] | None  # (device, inode, mtime ns, size); None = no file


def signature(path: Path) -> Signature:
    """What changes whenever the file at ``path`` is replaced or rewritten."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)


class FileCache(Generic[T]):
    """One file's parsed value, re-parsed only when its signature changes.

    Every cache of one path in this process is the same object (:func:`shared`), so a write
    through one reader is seen by every other at once; other processes' writes are seen within
    ``interval`` seconds.
    """

    def __init__(self, path: Path, interval: float = CHECK_INTERVAL_S) -> None:
        self.path = path
        self.interval = interval
        self._lock = threading.Lock()
        self._value: T | None = None
        self._signature: Signature = None
        self._checked_at = -math.inf

    def get(self, parse: Callable[[], T], *, fresh: bool = False) -> T:
        """The cached value, or ``parse()`` of the file when it changed since it was cached.

        ``fresh`` checks the file now, however recently it was checked (a cheap stat).
        """
        # the common case without the lock (asked dozens of times a request): a value and
        # its check time read together may be a moment old, as a read just before a put is
        value, checked_at = self._value, self._checked_at
        if value is not None and not fresh and time.monotonic() - checked_at < self.interval:
            return value
        with self._lock:
            now = time.monotonic()
            recent = now - self._checked_at < self.interval and not fresh
            if self._value is not None and recent:
                return self._value
            sig = signature(self.path)  # before parsing: a replace in between re-reads next time
            self._checked_at = now
            if self._value is None or sig != self._signature:
                self._value, self._signature = parse(), sig
            return self._value

    def put(self, value: T) -> None:
        """Record ``value`` as what the file now holds; call it after writing the file, under the
        file lock every writer takes (so no other write can come between the two)."""
        with self._lock:
            self._value, self._signature = value, signature(self.path)
            self._checked_at = time.monotonic()

    def invalidate(self) -> None:
        with self._lock:
            self._value = None


_SHARED: weakref.WeakValueDictionary[tuple[str, str], FileCache[Any]] = (
    weakref.WeakValueDictionary()
)
_SHARED_LOCK = threading.Lock()


def shared(path: Path, kind: str) -> FileCache[Any]:
    """The process-wide cache of ``path`` holding values of ``kind`` (a name: two kinds of reader
    of one file keep separate values); it lives while a reader holds it."""
    key = (os.path.abspath(path), kind)
    with _SHARED_LOCK:
        cache = _SHARED.get(key)
        if cache is None:
            cache = FileCache(path)
            _SHARED[key] = cache
        return cache
