"""The Chat page's small parts: the model picker's entries (and the choice kept for the next
start), the prompt box, the stats line under an answer, the context meter.
Tested by tests/gui/views/chat/test_parts.py and tests/gui/views/chat/test_session.py."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from PySide6.QtCore import QMimeData, Qt, Signal
from PySide6.QtGui import QKeyEvent
from PySide6.QtWidgets import (
    QComboBox,
    QHBoxLayout,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app.core.inference.images import supports_vision
from app.core.service import Hearth
from app.core.types import Delta
from app.settings import SettingsStore


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
        tags = [t for t, on in (("vision", self.vision), ("loaded", self.loaded)) if on]
        return self.id + (f"  ({', '.join(tags)})" if tags else "")


def chat_models(service: Hearth) -> list[ChatModel]:
    """The models the picker offers (loop thread): a local model that can chat and that a
    runtime on this machine can load (never an embedding model or a reranker); a remote one
    (a ready provider's PREFIX/id) always."""
    out = []
    for s in service.models.all():
        rt = service.runtimes.get(s.model.format)
        if rt is not None and rt.available() and "chat" in s.model.capabilities:
            out.append(ChatModel(s.model.id, s.state == "loaded", vision=supports_vision(s.model)))
    remote = service.routing.remote_models()
    out += [ChatModel(r.id, False, remote=r.provider, vision=True) for r in remote]
    return out


def fill_picker(combo: QComboBox, models: list[ChatModel], prefer: tuple[str | None, ...]) -> None:
    """List ``models`` in the picker and choose the first of ``prefer`` it lists (the current
    choice, the one kept from the last start), else one already in memory, else the first."""
    combo.blockSignals(True)
    combo.clear()
    for m in models:
        combo.addItem(m.label, m.id)
    listed = {m.id for m in models}
    loaded = [m.id for m in models if m.loaded]
    pick = next((p for p in (*prefer, *loaded) if p and p in listed), None)
    if pick is None and models:
        pick = models[0].id
    if pick is not None:
        combo.setCurrentIndex(combo.findData(pick))
    combo.blockSignals(False)


def input_row(prompt: QPlainTextEdit, send: QPushButton, stop: QPushButton) -> QHBoxLayout:
    """The prompt box with Send and Stop beside it."""
    prompt.setPlaceholderText("Message (Enter to send, Shift+Enter for a new line)")
    prompt.setFixedHeight(72)
    send.setDefault(True)
    stop.setEnabled(False)
    stop.setToolTip("Stop the answer (Esc)")
    buttons = QVBoxLayout()
    buttons.addWidget(send)
    buttons.addWidget(stop)
    row = QHBoxLayout()
    row.addWidget(prompt, 1)
    row.addLayout(buttons)
    return row


def remember_model(store: SettingsStore, model_id: str) -> None:
    """Keep ``model_id`` as the Chat page's choice for the next start (``chat.last_model``)."""
    s = store.load()
    if s.chat.last_model != model_id:
        store.update(chat=replace(s.chat, last_model=model_id))


def loaded_context(service: Hearth, model_id: str) -> int:
    """The context length ``model_id`` is loaded with (loop thread); 0: not loaded here."""
    return next((m.context_length for m in service.models.loaded() if m.model_id == model_id), 0)


class ContextMeter(QProgressBar):
    """How full the conversation's context is: the last turn's prompt and answer tokens
    against the loaded model's context length."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.used = 0
        self.total = 0
        self.setTextVisible(True)
        self.setMaximumWidth(220)
        self.reset()

    def set_usage(self, used: int, total: int) -> None:
        self.used, self.total = used, total
        if total <= 0:  # a remote model: its context is not known here
            self.setRange(0, 1)
            self.setValue(0)
            self._say(f"Context {used:,} tokens")
        else:
            self.setRange(0, total)
            self.setValue(min(used, total))
            self._say(f"Context {used:,} / {total:,} ({100 * used // total}%)")
        self.setToolTip(
            f"{self.text()}: the prompt and answer tokens of the last turn, of the"
            " model's context length"
        )

    def _say(self, text: str) -> None:
        """Show ``text`` whole: the bar is as wide as its text needs (the styles' margins too)."""
        self.setFormat(text)
        self.setMinimumWidth(self.fontMetrics().horizontalAdvance(text) + 24)

    def reset(self) -> None:
        self.used = self.total = 0
        self.setRange(0, 1)
        self.setValue(0)
        self._say("Context empty")
        self.setToolTip("How full the model's context is, after the first answer")


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
    if t is not None and t.prompt_ms > 0:  # from the request's start, loading aside
        parts.append(f"first token {first_token_seconds(final):.2f} s")
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


def first_token_seconds(final: Delta) -> float:
    """Time to the first token: preparing the prompt, waiting for a slot, reading the prompt."""
    t = final.timings
    return (t.prepare_ms + t.queue_ms + t.prompt_ms) / 1000.0 if t is not None else 0.0
