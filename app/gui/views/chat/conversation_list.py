"""The Chat page's sidebar: saved conversations, newest first, with search.

Per conversation (its context menu): Rename, Duplicate, Export Markdown…, Export JSON…,
Delete; a delete shows an Undo bar for a few seconds (the store keeps the row longer).
The store is a local SQLite file: its calls take a few milliseconds, on the GUI thread.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from PySide6.QtCore import QPoint, Qt, QTimer, Signal
from PySide6.QtGui import QAction
from PySide6.QtWidgets import (
    QFileDialog,
    QHBoxLayout,
    QInputDialog,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QMenu,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app.core.workspace.conversation_export import to_json, to_markdown
from app.core.workspace.conversations import ConversationStore, ConversationSummary
from app.errors import HearthError

log = logging.getLogger(__name__)

UNDO_MS = 8000  # how long the Undo bar stays after a delete
ID_ROLE = Qt.ItemDataRole.UserRole


def when(t: float, now: float | None = None) -> str:
    """A list date: the time for today, else the day."""
    d = datetime.fromtimestamp(t)
    today = datetime.fromtimestamp(now) if now is not None else datetime.now()
    return d.strftime("%H:%M") if d.date() == today.date() else d.strftime("%Y-%m-%d")


def safe_filename(title: str) -> str:
    keep = "".join(ch if ch.isalnum() or ch in " -_" else " " for ch in title)
    return "_".join(keep.split())[:60] or "conversation"


class ConversationList(QWidget):
    """Search box, New chat, the list, and an Undo bar after a delete."""

    conversation_opened = Signal(str)  # id: the user picked it
    new_chat_requested = Signal()
    conversation_deleted = Signal(str)  # id: hidden (undo brings it back)
    conversation_restored = Signal(str)  # id: the delete was undone
    conversation_renamed = Signal(str, str)  # id, title
    failed = Signal(str)  # a message for the page (an export that could not be written)

    def __init__(self, store: ConversationStore, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.store = store
        self.current_id: str | None = None  # the conversation the page shows
        self.undo_ms = UNDO_MS
        self._deleted: str | None = None  # the one the Undo bar would bring back

        self.search_edit = QLineEdit()
        self.search_edit.setPlaceholderText("Search conversations")
        self.search_edit.setClearButtonEnabled(True)
        self.new_button = QPushButton("New chat")
        self.new_button.setToolTip("Start a new chat (Ctrl+N)")
        self.list_widget = QListWidget()
        self.list_widget.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.list_widget.setWordWrap(True)
        self.empty_label = QLabel("No saved conversations yet.")
        self.empty_label.setWordWrap(True)

        self.undo_label = QLabel("")
        self.undo_button = QPushButton("Undo")
        self.undo_bar = QWidget()
        bar = QHBoxLayout(self.undo_bar)
        bar.setContentsMargins(0, 0, 0, 0)
        bar.addWidget(self.undo_label, 1)
        bar.addWidget(self.undo_button)
        self.undo_bar.hide()
        self.undo_timer = QTimer(self)
        self.undo_timer.setSingleShot(True)

        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        top = QHBoxLayout()
        top.addWidget(self.search_edit, 1)
        top.addWidget(self.new_button)
        layout.addLayout(top)
        layout.addWidget(self.list_widget, 1)
        layout.addWidget(self.empty_label)
        layout.addWidget(self.undo_bar)

        self.search_edit.textChanged.connect(self._on_search_edit_text_changed)
        self.new_button.clicked.connect(self._on_new_button_clicked)
        self.list_widget.itemClicked.connect(self._on_list_widget_item_clicked)
        self.list_widget.itemActivated.connect(self._on_list_widget_item_clicked)
        self.list_widget.customContextMenuRequested.connect(self._on_list_widget_menu_requested)
        self.undo_button.clicked.connect(self._on_undo_button_clicked)
        self.undo_timer.timeout.connect(self._on_undo_timer_timeout)
        self.refresh()

    # -- state -------------------------------------------------------------------------------------
    def ids(self) -> list[str]:
        """The ids listed, top to bottom."""
        return [self.list_widget.item(i).data(ID_ROLE) for i in range(self.list_widget.count())]

    def item_for(self, conv_id: str) -> QListWidgetItem | None:
        for i in range(self.list_widget.count()):
            item = self.list_widget.item(i)
            if item.data(ID_ROLE) == conv_id:
                return item
        return None

    # -- actions -----------------------------------------------------------------------------------
    def refresh(self) -> None:
        """List the conversations that match the search box, newest first."""
        rows = self.store.list(self.search_edit.text())
        self.list_widget.clear()
        for s in rows:
            item = QListWidgetItem(self._label(s), self.list_widget)
            item.setData(ID_ROLE, s.id)
            item.setToolTip(f"{s.title}\n{s.message_count} messages")
            if s.id == self.current_id:
                self.list_widget.setCurrentItem(item)
        searching = bool(self.search_edit.text().strip())
        self.empty_label.setText("No match." if searching else "No saved conversations yet.")
        self.empty_label.setVisible(not rows)

    def set_current(self, conv_id: str | None) -> None:
        """Mark the conversation the page shows (None: a new, unsaved chat)."""
        self.current_id = conv_id
        self.refresh()

    def rename(self, conv_id: str, title: str) -> None:
        if not title.strip():
            return
        self.store.rename(conv_id, title)
        self.refresh()
        self.conversation_renamed.emit(conv_id, " ".join(title.split()))

    def duplicate(self, conv_id: str) -> str:
        dup = self.store.duplicate(conv_id)
        self.refresh()
        return dup.id

    def delete(self, conv_id: str) -> None:
        """Hide it now; the Undo bar can bring it back for ``undo_ms``."""
        title = next((s.title for s in self.store.list() if s.id == conv_id), "")
        self.store.delete(conv_id)
        self._deleted = conv_id
        self.undo_label.setText(f"Deleted “{title or 'Untitled'}”")
        self.undo_bar.show()
        self.undo_timer.start(self.undo_ms)
        self.refresh()
        self.conversation_deleted.emit(conv_id)

    def undo_delete(self) -> None:
        conv_id, self._deleted = self._deleted, None
        self.undo_timer.stop()
        self.undo_bar.hide()
        if conv_id is None:
            return
        try:
            self.store.undelete(conv_id)
        except HearthError as e:
            self.failed.emit(str(e))
            return
        self.refresh()
        self.conversation_restored.emit(conv_id)

    def export_markdown(self, conv_id: str, path: Path) -> None:
        self._write(path, to_markdown(self.store.load(conv_id)))

    def export_json(self, conv_id: str, path: Path) -> None:
        data = to_json(self.store.load(conv_id))
        self._write(path, json.dumps(data, ensure_ascii=False, indent=2) + "\n")

    def context_menu(self, conv_id: str) -> QMenu:
        """The per-conversation menu (built on demand, so tests can trigger its actions)."""
        menu = QMenu(self)
        entries = (
            ("Rename…", self._ask_rename),
            ("Duplicate", self.duplicate),
            ("Export Markdown…", self._ask_export_markdown),
            ("Export JSON…", self._ask_export_json),
            ("Delete", self.delete),
        )
        for text, fn in entries:
            action = QAction(text, menu)
            action.triggered.connect(lambda _=False, fn=fn: fn(conv_id))
            menu.addAction(action)
        return menu

    # -- slots -------------------------------------------------------------------------------------
    def _on_search_edit_text_changed(self, _: str) -> None:
        self.refresh()

    def _on_new_button_clicked(self) -> None:
        self.new_chat_requested.emit()

    def _on_list_widget_item_clicked(self, item: QListWidgetItem) -> None:
        conv_id = item.data(ID_ROLE)
        if isinstance(conv_id, str) and conv_id != self.current_id:
            self.conversation_opened.emit(conv_id)

    def _on_list_widget_menu_requested(self, pos: QPoint) -> None:
        item = self.list_widget.itemAt(pos)
        if item is not None:
            self.context_menu(item.data(ID_ROLE)).exec(self.list_widget.mapToGlobal(pos))

    def _on_undo_button_clicked(self) -> None:
        self.undo_delete()

    def _on_undo_timer_timeout(self) -> None:
        self._deleted = None
        self.undo_bar.hide()

    # -- helpers -----------------------------------------------------------------------------------
    def _label(self, s: ConversationSummary) -> str:
        meta = " · ".join(x for x in (when(s.updated), s.model) if x)
        return f"{s.title or 'Untitled'}\n{meta}"

    def _title(self, conv_id: str) -> str:
        item = self.item_for(conv_id)
        return str(item.text()).split("\n", 1)[0] if item is not None else ""

    def _ask_rename(self, conv_id: str) -> None:
        title, ok = QInputDialog.getText(self, "Rename", "Title", text=self._title(conv_id))
        if ok:
            self.rename(conv_id, title)

    def _ask_export_markdown(self, conv_id: str) -> None:
        self._ask_export(conv_id, ".md", "Markdown (*.md)", self.export_markdown)

    def _ask_export_json(self, conv_id: str) -> None:
        self._ask_export(conv_id, ".json", "JSON (*.json)", self.export_json)

    def _ask_export(
        self, conv_id: str, ext: str, filt: str, write: Callable[[str, Path], None]
    ) -> None:
        name = safe_filename(self._title(conv_id)) + ext
        path, _ = QFileDialog.getSaveFileName(self, "Export", str(Path.home() / name), filt)
        if path:
            write(conv_id, Path(path))

    def _write(self, path: Path, text: str) -> None:
        try:
            path.write_text(text, encoding="utf-8")
        except OSError as e:
            log.warning("could not export to %s: %s", path, e)
            self.failed.emit(f"Could not write {path}: {e.strerror or e}")
