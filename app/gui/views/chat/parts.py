"""The Chat page's small parts: a model picker entry, the prompt box, the stats line.
Tested by tests/gui/views/chat/test_images.py and tests/gui/views/chat/test_session.py."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from PySide6.QtCore import QMimeData, Qt, Signal
from PySide6.QtGui import QKeyEvent
from PySide6.QtWidgets import QPlainTextEdit, QWidget

from app.core.types import Delta


@dataclass(frozen=True, slots=True)
class ChatModel:
    """An entry of the model picker: a local model, or a remote one (its provider's name)."""

    id: str
    loaded: bool
    remote: str | None = None
    vision: bool = False  # a local model with a projector (a remote one: its engine decides)

    @property
    def label(self) -> str:
        if self.remote is not None:
            return f"{self.id}  (remote: {self.remote})"
        return self.id + ("  (loaded)" if self.loaded else "")


class PromptEdit(QPlainTextEdit):
    """Enter sends; Shift+Enter starts a new line; Tab moves the focus on (no tab characters)."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setTabChangesFocus(True)
        # takes a paste (Ctrl+V, the context menu's Paste, a middle click) that is not text
        # for the box: files, long text (attachments); True when it took it
        self.take_paste: Callable[[QMimeData], bool] | None = None

    submitted = Signal()

    def canInsertFromMimeData(self, source: QMimeData) -> bool:  # noqa: N802 - Qt override
        # an image alone (a screenshot) is a paste too: the page takes it as an attachment
        return source.hasImage() or super().canInsertFromMimeData(source)

    def insertFromMimeData(self, source: QMimeData) -> None:  # noqa: N802 - Qt override
        if self.take_paste is None or not self.take_paste(source):
            super().insertFromMimeData(source)

    def keyPressEvent(self, e: QKeyEvent) -> None:  # noqa: N802 - Qt override
        if e.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter) and not (
            e.modifiers() & Qt.KeyboardModifier.ShiftModifier
        ):
            self.submitted.emit()
            return
        super().keyPressEvent(e)


def stats_text(final: Delta) -> str:
    """The line under an answer: tokens, thinking, cache, speed, why it stopped."""
    parts = []
    t = final.timings
    n = final.usage.completion_tokens if final.usage else (t.predicted_n if t else 0)
    parts.append(f"{n} tokens")
    if final.usage is not None and final.usage.reasoning_tokens:
        parts.append(f"{final.usage.reasoning_tokens} thinking")
    if final.usage is not None and final.usage.cached_tokens:
        parts.append(f"{final.usage.cached_tokens} prompt tokens from cache")
    if t is not None and t.predicted_per_second > 0:
        parts.append(f"{t.predicted_per_second:.1f} tok/s")
    if t is not None and t.cpu_busy:
        parts.append("CPU busy")
    reason = final.finish_reason or "stop"
    if reason == "length":
        parts.append("stopped at the token limit")
    elif reason == "cancelled":
        parts.append("stopped")
    return " · ".join(parts)
