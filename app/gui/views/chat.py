"""The Chat page: talk to a local or remote model, streaming its answer as it arrives."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import (
    QColor,
    QFont,
    QKeyEvent,
    QKeySequence,
    QPalette,
    QShortcut,
    QTextCharFormat,
    QTextCursor,
)
from PySide6.QtWidgets import (
    QComboBox,
    QDoubleSpinBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QSpinBox,
    QTextBrowser,
    QVBoxLayout,
    QWidget,
)

from app.core.generation import Generation
from app.core.requests import ChatRequest
from app.core.service import Hearth
from app.core.types import ChatMessage, Delta, SamplingParams
from app.gui.bridge import Bridge, log_failure
from app.gui.theme import is_dark
from app.gui.views.attachments import AttachmentBar, Prepare
from app.gui.views.common import PAGE_MARGINS, page_title

log = logging.getLogger(__name__)

DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant."
CPU_BUSY_NOTICE = (
    "Slower than usual: the CPU is busy with other programs, so Hearth decodes with fewer threads."
)
_ROLE_COLORS = {"user": "#0b57d0", "assistant": "#1a7f37", "error": "#b3261e", "meta": "#6b6b6b"}
# on a dark palette: the same hues, light enough to read on a dark background
_ROLE_COLORS_DARK = {
    "user": "#8ab4f8",
    "assistant": "#6fdd8b",
    "error": "#f28b82",
    "meta": "#a8a8a8",
}


def role_color(kind: str) -> QColor:
    """The transcript colour of ``kind`` for the palette in use (light or dark)."""
    return QColor((_ROLE_COLORS_DARK if is_dark() else _ROLE_COLORS)[kind])


@dataclass(frozen=True, slots=True)
class ChatModel:
    """An entry of the model picker: a local model, or a remote one (its provider's name)."""

    id: str
    loaded: bool
    remote: str | None = None

    @property
    def label(self) -> str:
        if self.remote is not None:
            return f"{self.id}  (remote: {self.remote})"
        return self.id + ("  (loaded)" if self.loaded else "")


class AnswerTurn:
    """One answer in flight. Lives on the loop thread: ``cancel`` is scheduled there, so it and
    the streaming coroutine never race."""

    def __init__(self) -> None:
        self.cancelled = False
        self.generation: Generation | None = None

    def cancel(self) -> None:
        self.cancelled = True
        if self.generation is not None:
            self.generation.cancel()


async def stream_answer(
    service: Hearth,
    turn: AnswerTurn,
    emit: Callable[[str], None],
    model_id: str,
    messages: Sequence[ChatMessage],
    sampling: SamplingParams,
    max_tokens: int | None,
    emit_reasoning: Callable[[str], None] | None = None,
    on_cpu_busy: Callable[[], None] | None = None,
    prepare: Prepare | None = None,
) -> Delta:
    """Load the model if needed and stream the answer's text to ``emit`` (and the model's
    reasoning, ``<think>`` or harmony analysis, to ``emit_reasoning``); return the final delta
    (finish reason, usage, timings). ``on_cpu_busy`` is called once, at the first delta decoded
    with fewer threads because other programs keep the CPU busy. ``prepare`` puts the attached
    files into the messages once the model is loaded (its context and tokenizer known)."""
    if not service.is_routable(model_id):  # a remote model (PREFIX/id) is not loaded here
        await service.load(model_id)  # explicit, so chatting works even with on-demand loading off
    if prepare is not None:  # attachments (issue 15): app/gui/views/attachments.py
        messages = await prepare(messages)
    if turn.cancelled:
        return Delta(finish_reason="cancelled")
    req = ChatRequest(model_id, tuple(messages), sampling=sampling, max_tokens=max_tokens)
    gen = (await service.chat(req)).first
    turn.generation = gen
    if turn.cancelled:
        gen.cancel()
    final: Delta | None = None
    busy_said = False
    try:
        async for d in gen:
            if d.cpu_busy and not busy_said and on_cpu_busy is not None:
                busy_said = True
                on_cpu_busy()
            if d.reasoning and emit_reasoning is not None:
                emit_reasoning(d.reasoning)
            if d.text:
                emit(d.text)
            if d.finish_reason is not None:
                final = d
    finally:
        gen.cancel()  # a no-op after a normal end; frees the slot if we left early
    if final is None:
        if turn.cancelled:
            return Delta(finish_reason="cancelled")
        return Delta(finish_reason="error", error="the answer ended without a final delta")
    return final


class PromptEdit(QPlainTextEdit):
    """Enter sends; Shift+Enter starts a new line; Tab moves the focus on (no tab characters)."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setTabChangesFocus(True)

    submitted = Signal()

    def keyPressEvent(self, e: QKeyEvent) -> None:  # noqa: N802 - Qt override
        if e.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter) and not (
            e.modifiers() & Qt.KeyboardModifier.ShiftModifier
        ):
            self.submitted.emit()
            return
        super().keyPressEvent(e)


class ChatPage(QWidget):
    """Multi-turn chat with one model; keeps the history as ``ChatMessage`` objects."""

    models_refreshed = Signal()
    answer_started = Signal()
    chunk_received = Signal(str)
    answer_finished = Signal(str)  # finish reason: stop | length | cancelled | error
    # emitted on the loop thread, delivered queued (in order) to the GUI thread
    _text_streamed = Signal(object, str)  # turn, text
    _reasoning_streamed = Signal(object, str)  # turn, reasoning text
    _cpu_busy_streamed = Signal(object)  # turn
    reasoning_received = Signal(str)

    def __init__(self, service: Hearth, bridge: Bridge, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._service = service
        self._bridge = bridge
        self.history: list[ChatMessage] = []
        self._turn: AnswerTurn | None = None
        self._answer_parts: list[str] = []
        self._thinking = False  # the reasoning of the answer in flight is being shown
        self._answer_start = 0  # where the answer in flight begins in the transcript
        self._sent_text = ""

        self.model_combo = QComboBox()
        self.model_combo.setMinimumContentsLength(28)
        self.model_combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToContents)
        self.system_edit = QPlainTextEdit(DEFAULT_SYSTEM_PROMPT)
        self.system_edit.setFixedHeight(56)
        self.temperature_spin = QDoubleSpinBox()
        self.temperature_spin.setRange(0.0, 2.0)
        self.temperature_spin.setSingleStep(0.1)
        self.temperature_spin.setValue(0.7)
        self.max_tokens_spin = QSpinBox()
        self.max_tokens_spin.setRange(0, 131072)
        self.max_tokens_spin.setSingleStep(128)
        self.max_tokens_spin.setSpecialValueText("No limit")
        self.max_tokens_spin.setValue(1024)
        self.clear_button = QPushButton("Clear conversation")

        top = QHBoxLayout()
        top.addWidget(page_title("Chat"))
        top.addStretch(1)
        top.addWidget(QLabel("Model"))
        top.addWidget(self.model_combo)
        top.addWidget(self.clear_button)

        options = QFormLayout()
        options.addRow("System prompt", self.system_edit)
        knobs = QHBoxLayout()
        knobs.addWidget(QLabel("Temperature"))
        knobs.addWidget(self.temperature_spin)
        knobs.addSpacing(16)
        knobs.addWidget(QLabel("Max tokens"))
        knobs.addWidget(self.max_tokens_spin)
        knobs.addStretch(1)
        options.addRow("", knobs)

        self.transcript = QTextBrowser()
        self.transcript.setOpenExternalLinks(True)
        self.transcript.setPlaceholderText("Pick a model, type a message below and press Enter.")

        self.prompt_edit = PromptEdit()
        self.prompt_edit.setPlaceholderText("Message (Enter to send, Shift+Enter for a new line)")
        self.prompt_edit.setFixedHeight(72)
        self.send_button = QPushButton("Send")
        self.send_button.setDefault(True)
        self.stop_button = QPushButton("Stop")
        self.stop_button.setEnabled(False)
        buttons = QVBoxLayout()
        buttons.addWidget(self.send_button)
        buttons.addWidget(self.stop_button)
        bottom = QHBoxLayout()
        bottom.addWidget(self.prompt_edit, 1)
        bottom.addLayout(buttons)

        self.stats_label = QLabel("")
        self.stats_label.setForegroundRole(QPalette.ColorRole.PlaceholderText)  # muted, any theme
        self.stop_button.setToolTip("Stop the answer (Esc)")
        # Esc anywhere on the page stops the answer in flight
        self.stop_shortcut = QShortcut(QKeySequence(Qt.Key.Key_Escape), self)
        self.stop_shortcut.setContext(Qt.ShortcutContext.WidgetWithChildrenShortcut)
        self.stop_shortcut.activated.connect(self._on_stop_shortcut_activated)
        self.clear_button.setToolTip("Start a new chat (Ctrl+N)")

        layout = QVBoxLayout(self)
        layout.setContentsMargins(*PAGE_MARGINS)
        layout.addLayout(top)
        layout.addLayout(options)
        layout.addWidget(self.transcript, 1)
        # attachments (issue 15): the Attach button and chips; files dropped or pasted
        self.attachments = AttachmentBar(service, bridge, self)
        self.attachments.install(self, self.prompt_edit, self.transcript.viewport())
        layout.addWidget(self.attachments)
        layout.addLayout(bottom)
        layout.addWidget(self.stats_label)

        self._text_streamed.connect(self._on_self_text_streamed)
        self._reasoning_streamed.connect(self._on_self_reasoning_streamed)
        self._cpu_busy_streamed.connect(self._on_self_cpu_busy_streamed)
        self.send_button.clicked.connect(self._on_send_button_clicked)
        self.prompt_edit.submitted.connect(self._on_send_button_clicked)
        self.stop_button.clicked.connect(self._on_stop_button_clicked)
        self.clear_button.clicked.connect(self._on_clear_button_clicked)
        for sig in (
            bridge.library_changed,
            bridge.model_loaded,
            bridge.model_unloaded,
            bridge.providers_changed,  # a provider came up or went down: its models too
        ):
            sig.connect(self._on_bridge_models_changed)
        bridge.model_loading.connect(self._on_bridge_model_loading)
        self.refresh_models()

    # -- state -------------------------------------------------------------------------------------
    @property
    def streaming(self) -> bool:
        return self._turn is not None

    @property
    def answer_text(self) -> str:
        """The answer being streamed (or the last one)."""
        return "".join(self._answer_parts)

    def current_model_id(self) -> str | None:
        data = self.model_combo.currentData()
        return data if isinstance(data, str) else None

    def select_model(self, model_id: str) -> None:
        i = self.model_combo.findData(model_id)
        if i >= 0:
            self.model_combo.setCurrentIndex(i)

    # -- actions -------------------------------------------------------------------------------------
    def refresh_models(self) -> None:
        self._bridge.call(self._usable_models, on_done=self._on_models_listed)

    def _usable_models(self) -> list[ChatModel]:
        # loop thread: a local model is offered when a runtime on this machine can load its
        # format; a remote one (a ready provider's PREFIX/id) always
        out = []
        for s in self._service.models():
            rt = self._service.runtimes.get(s.model.format)
            if rt is not None and rt.available():
                out.append(ChatModel(s.model.id, s.state == "loaded"))
        out += [ChatModel(r.id, False, remote=r.provider) for r in self._service.remote_models()]
        return out

    def send(self, text: str) -> bool:
        """Send a user message and stream the answer. Returns False when nothing was sent."""
        text = text.strip()
        model_id = self.current_model_id()
        if not text or self.streaming:
            return False
        if model_id is None:
            self._append_notice("Import a model on the Library page first.", "error")
            return False
        system = self.system_edit.toPlainText().strip()
        self.history.append(ChatMessage("user", text))
        messages = ([ChatMessage("system", system)] if system else []) + self.history
        self._append_header("You", "user")
        self._append_text(text)
        self._append_header(f"Assistant · {model_id}", "assistant")
        self._answer_start = self._cursor_at_end().position()
        self._answer_parts = []
        self._thinking = False
        self.stats_label.setText("Waiting for the model…")

        turn = AnswerTurn()
        self._turn = turn
        max_tokens = self.max_tokens_spin.value() or None
        self._sent_text = text  # back into the prompt box if the files stop the send
        prepare = self.attachments.preparer(model_id, max_tokens)  # attachments (issue 15)
        sampling = SamplingParams(temperature=self.temperature_spin.value())
        self._bridge.run(
            stream_answer(
                self._service,
                turn,
                partial(self._text_streamed.emit, turn),
                model_id,
                messages,
                sampling,
                max_tokens,
                partial(self._reasoning_streamed.emit, turn),
                partial(self._cpu_busy_streamed.emit, turn),
                prepare,
            ),
            on_done=partial(self._on_turn_done, turn),
            on_error=partial(self._on_turn_failed, turn),
        )
        self._update_buttons()
        self.answer_started.emit()
        return True

    def stop(self) -> None:
        """Cancel the answer in flight; the text so far stays in the conversation."""
        if self._turn is not None:
            self.stats_label.setText("Stopping…")
            self._bridge.call(self._turn.cancel)

    def new_chat(self) -> None:
        """Ctrl+N: a fresh conversation (stopping an answer in flight), ready to type."""
        self.clear()
        self.prompt_edit.setFocus()

    def clear(self) -> None:
        self.stop()
        self._finish_turn()
        self.history.clear()
        self._answer_parts = []
        self.attachments.clear()
        self.transcript.clear()
        self.stats_label.clear()

    # -- slots ---------------------------------------------------------------------------------------
    def _on_send_button_clicked(self) -> None:
        if self.send(self.prompt_edit.toPlainText()):
            self.prompt_edit.clear()

    def _on_stop_button_clicked(self) -> None:
        self.stop()

    def _on_stop_shortcut_activated(self) -> None:
        self.stop()

    def _on_clear_button_clicked(self) -> None:
        self.clear()

    def _on_bridge_models_changed(self, *_: object) -> None:
        self.refresh_models()

    def _on_bridge_model_loading(self, model_id: str) -> None:
        if self.streaming and model_id == self.current_model_id() and not self._answer_parts:
            self.stats_label.setText(f"Loading {model_id}…")

    def _on_models_listed(self, models: list[ChatModel]) -> None:
        keep = self.current_model_id()
        self.model_combo.blockSignals(True)
        self.model_combo.clear()
        for m in models:
            self.model_combo.addItem(m.label, m.id)
        if keep is not None and self.model_combo.findData(keep) >= 0:
            self.select_model(keep)
        elif models:  # prefer a model that is already in memory
            loaded = next((m.id for m in models if m.loaded), None)
            self.select_model(loaded or models[0].id)
        self.model_combo.blockSignals(False)
        self.model_combo.setPlaceholderText("No models: import one on the Library page")
        self._update_buttons()
        self.models_refreshed.emit()

    def _on_self_reasoning_streamed(self, turn: AnswerTurn, text: str) -> None:
        """The model's reasoning, shown dimmed under a "Thinking" label; never part of the
        history sent back to it."""
        if turn is not self._turn:
            return
        if not self._thinking:
            self._thinking = True
            self.stats_label.setText("Thinking…")  # only now: this model reasons
            self._append_notice("Thinking", "meta")
            self._cursor_at_end().insertBlock()
        self._append_text(text, "reasoning")
        self.reasoning_received.emit(text)

    def _on_self_cpu_busy_streamed(self, turn: AnswerTurn) -> None:
        """Say why this answer is slow, once, above it (under its header): put in the stream's
        own place it would split the answer's text in two."""
        if turn is not self._turn:
            return
        bar = self.transcript.verticalScrollBar()
        follow = bar.value() >= bar.maximum() - 4
        cur = QTextCursor(self.transcript.document())
        cur.setPosition(self._answer_start)
        fmt = QTextCharFormat()
        fmt.setForeground(role_color("meta"))
        fmt.setFontItalic(True)
        cur.insertText(CPU_BUSY_NOTICE, fmt)
        cur.insertBlock()
        cur.setCharFormat(QTextCharFormat())
        if follow:
            bar.setValue(bar.maximum())

    def _on_self_text_streamed(self, turn: AnswerTurn, text: str) -> None:
        if turn is not self._turn:
            return  # a late chunk of a cleared conversation
        if self._thinking:  # the answer starts below the reasoning
            self._thinking = False
            cur = self._cursor_at_end()
            cur.insertBlock()
            cur.insertBlock()
            text = text.lstrip("\n") if not self._answer_parts else text
        if not self._answer_parts:  # the first token: no longer loading or thinking
            self.stats_label.setText("Answering…")
        self._answer_parts.append(text)
        self._append_text(text)
        self.chunk_received.emit(text)

    def _on_turn_done(self, turn: AnswerTurn, final: Delta) -> None:
        if turn is not self._turn:
            return
        answer = self.answer_text
        reason = final.finish_reason or "stop"
        if answer:
            self.history.append(ChatMessage("assistant", answer))
        elif self.history and self.history[-1].role == "user":
            self.history.pop()  # nothing came back: keep user/assistant turns alternating
        stats = _stats_text(final)
        if final.error and reason == "error":
            self._append_notice(f"Error: {final.error}", "error")
            self.stats_label.setText(f"Error: {final.error}")
        else:
            self._append_notice(stats, "meta")
            self.stats_label.setText(stats)
            self.attachments.answer_done(self)  # "Used: report.pdf p.3, ..." (issue 15)
        self._finish_turn()
        self.answer_finished.emit(reason)

    def _on_turn_failed(self, turn: AnswerTurn, exc: BaseException) -> None:
        if turn is not self._turn:
            return
        text = log_failure(log, "chat failed", exc)
        if self.history and self.history[-1].role == "user":
            self.history.pop()
        if self.answer_text:
            self.history.append(ChatMessage("assistant", self.answer_text))
        self._append_notice(f"Error: {text}", "error")
        self.stats_label.setText(f"Error: {text}")
        self.attachments.turn_failed(self, exc, self._sent_text)  # issue 15: not sent
        self._finish_turn()
        self.answer_finished.emit("error")

    # -- helpers -------------------------------------------------------------------------------------
    def _finish_turn(self) -> None:
        self._turn = None
        self._update_buttons()

    def _update_buttons(self) -> None:
        busy = self.streaming
        self.send_button.setEnabled(not busy and self.model_combo.count() > 0)
        self.stop_button.setEnabled(busy)
        self.model_combo.setEnabled(not busy)

    def _cursor_at_end(self) -> QTextCursor:
        cur = self.transcript.textCursor()
        cur.movePosition(QTextCursor.MoveOperation.End)
        return cur

    def _append_header(self, text: str, kind: str) -> None:
        cur = self._cursor_at_end()
        if not self.transcript.document().isEmpty():
            cur.insertBlock()
            cur.insertBlock()
        fmt = QTextCharFormat()
        fmt.setFontWeight(QFont.Weight.Bold)
        fmt.setForeground(role_color(kind))
        cur.insertText(text, fmt)
        cur.insertBlock()
        cur.setCharFormat(QTextCharFormat())
        self.transcript.setTextCursor(cur)

    def _append_text(self, text: str, kind: str = "text") -> None:
        bar = self.transcript.verticalScrollBar()
        follow = bar.value() >= bar.maximum() - 4  # keep following unless the user scrolled up
        fmt = QTextCharFormat()
        if kind == "reasoning":
            fmt.setForeground(role_color("meta"))
            fmt.setFontItalic(True)
        self._cursor_at_end().insertText(text, fmt)
        if follow:
            bar.setValue(bar.maximum())

    def _append_notice(self, text: str, kind: str) -> None:
        cur = self._cursor_at_end()
        cur.insertBlock()
        fmt = QTextCharFormat()
        fmt.setForeground(role_color(kind))
        fmt.setFontItalic(kind == "meta")
        cur.insertText(text, fmt)
        self.transcript.verticalScrollBar().setValue(self.transcript.verticalScrollBar().maximum())


def _stats_text(final: Delta) -> str:
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
