"""The last listing of featured models (an empty search) that came back, kept on disk so Discover
still has something to show when the Hub cannot be reached.
Tested by tests/core/hub/test_client.py and tests/core/hub/test_offline.py."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from app.core.hub.catalog import ModelSummary
from app.core.util import filecache
from app.core.util.fsutil import atomic_write_json, file_lock, read_json

log = logging.getLogger(__name__)

MAX_KEYS = 16  # (format, sort) pairs kept; a few bytes each


@dataclass(frozen=True, slots=True)
class Listing:
    """Featured models. ``cached_at`` is set when the Hub could not be reached and these are the
    last ones it sent (``unreachable`` says why it could not be reached)."""

    results: tuple[ModelSummary, ...]
    cached_at: datetime | None = None
    unreachable: str | None = None


def summary_to_json(s: ModelSummary) -> dict[str, Any]:
    return {**s.as_dict(), "library_name": s.library_name}


def summary_from_json(d: dict[str, Any]) -> ModelSummary:
    def when(v: Any) -> datetime | None:
        return datetime.fromisoformat(v) if isinstance(v, str) else None

    size = d.get("size_range")
    gated = d.get("gated")
    return ModelSummary(
        id=str(d["id"]),
        author=d.get("author"),
        downloads=int(d.get("downloads") or 0),
        likes=int(d.get("likes") or 0),
        last_modified=when(d.get("last_modified")),
        created_at=when(d.get("created_at")),
        gated=gated if gated in ("auto", "manual") else bool(gated),
        private=bool(d.get("private")),
        license=d.get("license"),
        tags=tuple(t for t in d.get("tags") or () if isinstance(t, str)),
        library_name=d.get("library_name"),
        pipeline_tag=d.get("pipeline_tag"),
        format=d.get("format"),
        size_range=(int(size[0]), int(size[1]))
        if isinstance(size, list) and len(size) == 2
        else None,
    )


class ListingCache:
    """``{key: {"saved_at": unix time, "results": [summary, ...]}}`` in one JSON file (atomic
    writes under a file lock; reads from memory unless another process replaced the file)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._cache: filecache.FileCache[dict[str, Any]] = filecache.shared(path, "hub-listings")

    def _read(self) -> dict[str, Any]:
        try:
            raw = read_json(self.path, {})
        except ValueError as e:
            log.warning("hub listing cache %s is invalid (%s); ignoring it", self.path, e)
            return {}
        return raw if isinstance(raw, dict) else {}

    def save(self, key: str, results: list[ModelSummary]) -> None:
        entry = {"saved_at": time.time(), "results": [summary_to_json(r) for r in results]}
        try:
            with file_lock(self.path):
                data = dict(self._read())
                data.pop(key, None)
                data[key] = entry
                data = dict(list(data.items())[-MAX_KEYS:])  # the latest keys, newest last
                atomic_write_json(self.path, data)
                self._cache.put(data)
        except OSError as e:  # a cache: the listing itself already came back
            log.warning("cannot write the hub listing cache %s: %s", self.path, e)

    def set_size(self, repo_id: str, size_range: tuple[int, int] | None) -> None:
        """Record a repo's size range (found after the listing came back) in every kept listing
        that has the repo, so the sizes show offline too."""
        if size_range is None:
            return
        try:
            with file_lock(self.path):
                data = self._read()
                hits = [
                    d
                    for entry in data.values()
                    if isinstance(entry, dict)
                    for d in entry.get("results") or ()
                    if isinstance(d, dict) and d.get("id") == repo_id
                ]
                if not hits or all(d.get("size_range") == list(size_range) for d in hits):
                    return
                for d in hits:
                    d["size_range"] = list(size_range)
                atomic_write_json(self.path, data)
                self._cache.put(data)
        except OSError as e:
            log.warning("cannot write the hub listing cache %s: %s", self.path, e)

    def load(self, key: str) -> Listing | None:
        entry = self._cache.get(self._read).get(key)
        if not isinstance(entry, dict):
            return None
        try:
            results = tuple(summary_from_json(d) for d in entry.get("results") or ())
            saved = datetime.fromtimestamp(float(entry["saved_at"]), tz=UTC)
        except (KeyError, TypeError, ValueError) as e:
            log.warning("hub listing cache %s: entry %s is invalid (%s)", self.path, key, e)
            return None
        return Listing(results, cached_at=saved)
