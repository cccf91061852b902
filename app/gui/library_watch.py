"""LibraryWatch: the open window follows library changes made elsewhere (a `hearth import` in a
terminal, a GGUF file copied into the models folder) without a click.
Tested by tests/gui/views/library/test_live_library.py."""

from __future__ import annotations

import logging

from PySide6.QtCore import QFileSystemWatcher, QObject, QTimer

from app.core.service import Hearth
from app.gui.bridge import Bridge

log = logging.getLogger(__name__)

CHECK_INTERVAL_MS = 1000


class LibraryWatch(QObject):
    """Asks the service to check the library on disk when the index's folder or the models
    folder changes, and every second besides: file watchers miss atomic renames on some
    filesystems, and a folder watch says nothing while a copied file is still growing. The
    service publishes LibraryChanged, which every page already follows."""

    def __init__(self, service: Hearth, bridge: Bridge, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._service = service
        self._bridge = bridge
        self._pending = False  # one check at a time: a slow disk never queues a backlog
        changes = service.models.changes
        self.watcher = QFileSystemWatcher(self)
        for path in (changes.index_file.parent, changes.models_dir):
            if path.is_dir():
                self.watcher.addPath(str(path))
        self.watcher.directoryChanged.connect(self._on_watcher_changed)
        self.timer = QTimer(self)
        self.timer.setInterval(CHECK_INTERVAL_MS)
        self.timer.timeout.connect(self.check)
        self.timer.start()

    def check(self) -> None:
        """Have the service compare the library on disk with what it last saw."""
        if self._pending:
            return
        self._pending = True
        self._bridge.call(
            self._service.models.changes.check, on_done=self._on_checked, on_error=self._on_failed
        )

    def _on_watcher_changed(self, _path: str) -> None:
        self.check()

    def _on_checked(self, _changed: bool) -> None:
        self._pending = False

    def _on_failed(self, exc: BaseException) -> None:
        self._pending = False
        log.warning("library check failed: %s", exc)
