"""The parsed content of a file several processes share (settings, the library index), kept in
memory so that a request never reads it: one ``stat`` at most every ``CHECK_INTERVAL_S`` tells
whether another process replaced it (every writer replaces it atomically, so its inode changes).
A read that must be fresh (a name not found may have just been added by another process) looks
at the file again unless it was looked at after the request being served arrived
(:func:`serving`): every write finished before the request came is seen either way, and a
request that misses a name in several places stats each file once, not once a place.
Tested by tests/core/util/test_filecache.py, tests/server/test_disk_reads.py and
tests/server/edge/test_vision.py."""

from __future__ import annotations

import contextvars
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

# when the request being served arrived (time.monotonic); +inf outside a request: a fresh read
# then always looks at the file
_SERVING_SINCE: contextvars.ContextVar[float] = contextvars.ContextVar(
    "filecache_serving_since", default=math.inf
)


def serving(arrived: float) -> contextvars.Token[float]:
    """Mark the current task (and the tasks it starts) as serving a request that arrived at
    ``arrived`` (time.monotonic): its fresh reads need no look at a file that was looked at
    since. Returns the token to :func:`done_serving` with."""
    return _SERVING_SINCE.set(arrived)


def done_serving(token: contextvars.Token[float]) -> None:
    _SERVING_SINCE.reset(token)


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

        ``fresh`` checks the file now (a cheap stat), unless it was checked after the request
        being served arrived (:func:`serving`) and within ``interval``: a task started while a
        request was served carries its arrival on, and its fresh reads must not go unchecked
        for longer than anyone's.
        """
        # the common case without the lock (asked dozens of times a request): a value and
        # its check time read together may be a moment old, as a read just before a put is
        value, checked_at = self._value, self._checked_at
        if (
            value is not None
            and time.monotonic() - checked_at < self.interval
            and (not fresh or checked_at >= _SERVING_SINCE.get())
        ):
            return value
        with self._lock:
            now = time.monotonic()
            checked_at = self._checked_at
            recent = now - checked_at < self.interval
            if fresh:
                recent = recent and checked_at >= _SERVING_SINCE.get()
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
            now = time.monotonic()  # before the stat, as in get: what it sees is as of now
            self._value, self._signature = value, signature(self.path)
            self._checked_at = now

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
