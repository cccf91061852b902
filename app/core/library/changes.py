"""IndexChanges: notices library changes made by other processes (a `hearth import` in a terminal)
or by the models-folder scan, and publishes LibraryChanged so an open window follows them.
Tested by tests/core/library/test_changes.py and tests/gui/views/library/test_live_library.py."""

from __future__ import annotations

from pathlib import Path

from app.core.events import EventHub, LibraryChanged
from app.core.library.index import ModelLibrary
from app.core.util.filecache import Signature, signature


class IndexChanges:
    """Compares the library index on disk with what the last check saw."""

    def __init__(self, library: ModelLibrary, events: EventHub) -> None:
        self._library = library
        self._events = events
        self.index_file: Path = library.index_file
        self.models_dir: Path = library.models_dir
        self._seen: Signature = signature(library.index_file)

    def check(self) -> bool:
        """Publish LibraryChanged when the index changed since the last check (a stat, plus a
        models-folder scan at most every few seconds, off this thread). True when it did."""
        sig = self._library.poll()
        if sig == self._seen:
            return False
        self._seen = sig
        self._events.publish(LibraryChanged())
        return True
