"""The app's log as it is written: the last lines of logs/hearth.log, following appends, a
rotation (the file renamed away and a new one started) and a file that is not there yet.
Tested by tests/gui/views/server/test_log_tail.py."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from PySide6.QtCore import QFileSystemWatcher, Qt, QTimer
from PySide6.QtGui import QFontDatabase, QTextCursor
from PySide6.QtWidgets import QLabel, QPlainTextEdit, QVBoxLayout, QWidget

from app.gui.bridge import Bridge

log = logging.getLogger(__name__)

LOG_NAME = "hearth.log"
MAX_LINES = 1000  # the view keeps this many; older lines scroll out
FIRST_READ_BYTES = 64 * 1024  # how far back the first read looks
MAX_READ_BYTES = 1024 * 1024  # one read takes at most this much new text (a burst skips ahead)
POLL_MS = 1000  # the fallback check: watchers miss some renames and appends


@dataclass
class Chunk:
    """New text of the log since the last read; ``restarted``: the file was replaced (a
    rotation) or is gone, so what was shown came from an older file."""

    text: str
    restarted: bool
    missing: bool


class LogFollower:
    """Where the last read stopped in which file; plain Python, run on the service loop."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._inode: int | None = None
        self._offset = 0

    def read_new(self) -> Chunk:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            restarted = self._inode is not None
            self._inode, self._offset = None, 0
            return Chunk("", restarted, True)
        restarted, initial = False, self._inode is None
        if initial:
            self._offset = max(0, st.st_size - FIRST_READ_BYTES)
        elif st.st_ino != self._inode or st.st_size < self._offset:
            restarted, self._offset = True, 0  # rotated or truncated: read the new file whole
        self._inode = st.st_ino
        if st.st_size == self._offset:
            return Chunk("", restarted, False)
        start = max(self._offset, st.st_size - MAX_READ_BYTES)
        with open(self.path, "rb") as f:
            f.seek(start)
            data = f.read(st.st_size - start)
        mid_line = start > 0 and (initial or start != self._offset)
        self._offset = start + len(data)
        text = data.decode("utf-8", errors="replace")
        if mid_line and "\n" in text:
            text = text.split("\n", 1)[1]  # began mid-line: drop the partial first line
        return Chunk(text, restarted, False)


class LogTail(QWidget):
    """A read-only view of the log's last ``MAX_LINES`` lines, kept current while shown."""

    def __init__(self, logs_dir: Path, bridge: Bridge, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.path = logs_dir / LOG_NAME
        self._bridge = bridge
        self._follower = LogFollower(self.path)
        self._pending = False
        self._partial = ""  # the last line until its newline arrives
        self.reads = 0  # reads finished (tests wait on this)

        self.view = QPlainTextEdit()
        self.view.setReadOnly(True)
        self.view.setMaximumBlockCount(MAX_LINES)
        self.view.setLineWrapMode(QPlainTextEdit.LineWrapMode.NoWrap)
        self.view.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        self.status = QLabel()
        self.status.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.view, 1)
        layout.addWidget(self.status)
        self._show_missing(not self.path.exists())

        self.watcher = QFileSystemWatcher(self)
        if logs_dir.is_dir():
            self.watcher.addPath(str(logs_dir))
        self.watcher.directoryChanged.connect(self._on_watcher_changed)
        self.watcher.fileChanged.connect(self._on_watcher_changed)
        self.timer = QTimer(self)
        self.timer.setInterval(POLL_MS)
        self.timer.timeout.connect(self.refresh)
        self.timer.start()
        self.refresh()

    def lines(self) -> list[str]:
        """The lines shown, oldest first."""
        text = self.view.toPlainText()
        return text.split("\n") if text else []

    def refresh(self) -> None:
        """Read what was appended since the last read (off the GUI thread)."""
        if self._pending:
            return
        self._pending = True
        self._bridge.call(self._follower.read_new, on_done=self._on_read, on_error=self._on_failed)

    def _on_watcher_changed(self, _path: str) -> None:
        if self.path.exists() and str(self.path) not in self.watcher.files():
            self.watcher.addPath(str(self.path))  # a new file after a rotation
        self.refresh()

    def _on_read(self, chunk: Chunk) -> None:
        self._pending = False
        self.reads += 1
        if chunk.restarted:
            self._partial = ""
            self.view.appendPlainText("--- the log was rotated or removed; following the new file")
        self._show_missing(chunk.missing)
        if not chunk.text:
            return
        text = self._partial + chunk.text
        complete, newline, self._partial = text.rpartition("\n")
        if not newline:
            return
        bar = self.view.verticalScrollBar()
        at_end = bar.value() >= bar.maximum() - 2  # follow the end unless the user scrolled up
        self.view.appendPlainText(complete)
        if at_end:
            self.view.moveCursor(QTextCursor.MoveOperation.End)
            bar.setValue(bar.maximum())

    def _on_failed(self, exc: BaseException) -> None:
        self._pending = False
        log.debug("reading %s failed: %s", self.path, exc)
        self.status.setText(f"Cannot read {self.path}: {exc}")

    def _show_missing(self, missing: bool) -> None:
        self.status.setText(
            f"No log file yet: {self.path}" if missing else f"Following {self.path}"
        )
