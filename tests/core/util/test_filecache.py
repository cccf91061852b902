"""A shared file's cache: a fresh read looks at the file, except when it was looked at after
the request being served arrived; whatever was written before the request came is seen."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from app.core.util import filecache


class Stats:
    """Counts filecache.signature calls (the stat a check costs)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        real = filecache.signature

        def counted(path: Path) -> filecache.Signature:
            self.calls += 1
            return real(path)

        monkeypatch.setattr(filecache, "signature", counted)


def write(path: Path, value: object) -> None:
    """Another process's atomic replace (a new inode)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(value))
    os.replace(tmp, path)


def cached(tmp_path: Path) -> tuple[Path, filecache.FileCache[object], Callable[[], object]]:
    """A file holding 1, and a cache of it that has looked at it once (before any request)."""
    path = tmp_path / "f.json"
    write(path, 1)
    cache: filecache.FileCache[object] = filecache.FileCache(path)

    def parse() -> object:
        return json.loads(path.read_text())

    assert cache.get(parse) == 1
    return path, cache, parse


def test_outside_a_request_every_fresh_read_looks_at_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, cache, parse = cached(tmp_path)
    stats = Stats(monkeypatch)
    for _ in range(3):
        assert cache.get(parse, fresh=True) == 1
    assert stats.calls == 3


def test_a_request_looks_at_the_file_once_however_many_fresh_reads_it_makes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, cache, parse = cached(tmp_path)
    write(path, 2)  # another process, before the request arrives
    stats = Stats(monkeypatch)
    token = filecache.serving(time.monotonic())
    try:
        # the look before the request does not count: the first fresh read looks again
        assert cache.get(parse, fresh=True) == 2
        assert cache.get(parse, fresh=True) == 2
        assert cache.get(parse, fresh=True) == 2
    finally:
        filecache.done_serving(token)
    assert stats.calls == 1
    # the next request looks again, and sees what was written meanwhile
    write(path, 3)
    token = filecache.serving(time.monotonic())
    try:
        assert cache.get(parse, fresh=True) == 3
    finally:
        filecache.done_serving(token)
    assert stats.calls == 2


def test_a_fresh_read_looks_again_once_the_last_look_is_older_than_the_interval(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A task started while a request was served carries the request's arrival on: its fresh
    reads look at the file again once the last look is ``interval`` old, however long ago the
    request came (a clock of the test's own: no waiting)."""
    clock = [1000.0]
    monkeypatch.setattr(filecache.time, "monotonic", lambda: clock[0])
    path, cache, parse = cached(tmp_path)  # looked at, at 1000
    stats = Stats(monkeypatch)
    token = filecache.serving(999.0)  # the request came before that look
    try:
        assert cache.get(parse, fresh=True) == 1
        assert stats.calls == 0  # looked at since it arrived
        write(path, 2)
        clock[0] += cache.interval  # the look is now an interval old
        assert cache.get(parse, fresh=True) == 2
        assert stats.calls == 1
    finally:
        filecache.done_serving(token)
