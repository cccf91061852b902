"""The Chat page: talk to a local or remote model, streaming its answer as it arrives."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from functools import partial
from itertools import count
from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QColor, QKeySequence, QPalette, QShortcut
from PySide6.QtWidgets import (
    QComboBox,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from app.core.service import Hearth
from app.core.types import ChatMessage, Delta
from app.core.workspace.chat_images import ChatImage, has_sources, user_message
from app.core.workspace.conversations import ConversationStore
from app.gui.bridge import Bridge, log_failure
from app.gui.views.chat.answer import AnswerTurn, stream_answer
from app.gui.views.chat.attachments import AttachmentBar
from app.gui.views.chat.mcp_tools import McpChat, McpTurn
from app.gui.views.chat.options_panel import DEFAULT_SYSTEM_PROMPT, ChatOptionsPanel, StepAside
from app.gui.views.chat.parts import (
    ChatModel,
    ContextMeter,
    PromptEdit,
    chat_models,
    fill_picker,
    input_row,
    loaded_context,
    remember_model,
    stats_text,
)
from app.gui.views.chat.session import ChatSession
from app.gui.views.chat.transcript import MessageView, Transcript, kind_color
from app.gui.views.common import PAGE_MARGINS, page_title
from app.settings import SettingsStore

log = logging.getLogger(__name__)

__all__ = ["DEFAULT_SYSTEM_PROMPT", "ChatPage"]
NO_MODEL_NOTICE = "Import a model on the Library page first."
CPU_BUSY_NOTICE = (
    "Slower than usual: the CPU is busy with other programs, so Hearth decodes with fewer threads."
)


def role_color(kind: str) -> QColor:
    """The transcript colour of ``kind`` for the palette in use (light or dark)."""
    return QColor(kind_color(kind))


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
    conversation_cleared = Signal()  # clear(): a new chat (the saved one is left)
    turn_dropped = Signal(str)  # a failed turn's question (message id), asked again

    def __init__(
        self,
        service: Hearth,
        bridge: Bridge,
        parent: QWidget | None = None,
        *,
        conversations: ConversationStore | None = None,
        mcp: Any = None,
        settings: SettingsStore | None = None,
        cache_root: Path | None = None,
    ) -> None:
        super().__init__(parent)
        self._service = service
        self._bridge = bridge
        self.history: list[ChatMessage] = []
        self.history_ids: list[str] = []  # history[i]'s message id: its view in the transcript
        self._ids = count(1)
        self._turn: AnswerTurn | McpTurn | None = None
        self._answer_parts: list[str] = []
        self._thinking = False  # the answer in flight has reasoned (its text follows)
        self._answer_view: MessageView | None = None
        self._sent_text = ""  # back into the prompt box if the attached files stop the send
        self._models: dict[str, ChatModel] = {}  # the picker's entries by id
        self._no_model_notice: str | None = None  # "import a model first", until one comes

        self.model_combo = QComboBox()
        self.model_combo.setMinimumContentsLength(14)
        self.model_combo.setSizeAdjustPolicy(
            QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon
        )
        self._settings = settings
        # the conversation's settings, in a side panel the Settings button shows and hides
        self.options = ChatOptionsPanel(service, bridge)
        self.system_edit = self.options.system_edit
        self.temperature_spin = self.options.temperature_spin
        self.max_tokens_spin = self.options.max_tokens_spin
        self.options_button = QPushButton("Settings")
        self.options_button.setCheckable(True)
        self.options_button.setChecked(True)
        self.options_button.setToolTip("Show or hide this chat's settings")
        self.clear_button = QPushButton("Clear")  # short: the header must fit the narrowest window
        self.meter = ContextMeter()

        top = QHBoxLayout()
        top.addWidget(page_title("Chat"))
        top.addStretch(1)
        top.addWidget(QLabel("Model"))
        top.addWidget(self.model_combo)
        top.addWidget(self.meter)
        top.addWidget(self.clear_button)
        # MCP tools: the tools menu; each call's block goes into the answer that made it
        self.mcp = McpChat(service, bridge, mcp, notice=self._mcp_notice, place=self._place_block)
        self.last_extras: dict[str, Any] = {}  # the last answer's tool_calls / tool_results
        top.addWidget(self.mcp.button)
        top.addWidget(self.options_button)

        self.transcript = Transcript()
        # saved conversations, the sidebar and branches (session.py); none: chats go unsaved
        self.session = (
            ChatSession(self, conversations, parent=self) if conversations is not None else None
        )

        self.prompt_edit = PromptEdit()
        self.send_button = QPushButton("Send")
        self.stop_button = QPushButton("Stop")
        bottom = input_row(self.prompt_edit, self.send_button, self.stop_button)

        self.stats_label = QLabel("")
        self.stats_label.setForegroundRole(QPalette.ColorRole.PlaceholderText)  # muted, any theme
        # a long error wraps here rather than widening the page past the window (Send cut off)
        self.stats_label.setWordWrap(True)
        # Esc anywhere on the page stops the answer in flight
        self.stop_shortcut = QShortcut(QKeySequence(Qt.Key.Key_Escape), self)
        self.stop_shortcut.setContext(Qt.ShortcutContext.WidgetWithChildrenShortcut)
        self.stop_shortcut.activated.connect(self._on_stop_shortcut_activated)
        self.clear_button.setToolTip("Start a new chat (Ctrl+N)")

        layout = QVBoxLayout(self)
        layout.setContentsMargins(*PAGE_MARGINS)
        layout.addLayout(top)
        layout.addWidget(self._with_sidebar(self.transcript), 1)
        # attachments: the Attach button and chips; files dropped or pasted
        self.attachments = AttachmentBar(
            service, bridge, self, settings=settings, cache_root=cache_root
        )
        self.attachments.install(self, self.prompt_edit, self.transcript.viewport())
        self.attachments.image_refusal = self.image_refusal  # images: a vision model only
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
        self.options_button.toggled.connect(self.options.setVisible)
        self.step_aside = StepAside(self, self.options_button)  # a narrow page hides the panel
        self.model_combo.activated.connect(self._on_model_combo_activated)
        self.transcript.regenerate_requested.connect(self.regenerate)
        self.transcript.edit_submitted.connect(self.edit_and_resend)
        self.transcript.delete_requested.connect(self.delete_message)
        for sig in (
            bridge.library_changed,
            bridge.model_loaded,
            bridge.model_unloaded,
            bridge.providers_changed,  # a provider came up or went down: its models too
        ):
            sig.connect(self._on_bridge_models_changed)
        bridge.model_loading.connect(self._on_bridge_model_loading)
        if self.session is not None:
            self._connect_session(self.session)
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

    def offers_model(self, model_id: str) -> bool:
        return self.model_combo.findData(model_id) >= 0

    def chat_options(self) -> tuple[str, dict[str, Any]]:
        """The system prompt and the side panel's settings, as a conversation keeps them."""
        return self.options.system_prompt(), self.options.params()

    def saved_blocks(self, extras: dict[str, Any]) -> Sequence[QWidget]:
        return self.mcp.saved_blocks(extras)

    # -- actions -------------------------------------------------------------------------------------
    def refresh_models(self) -> None:
        self._bridge.call(chat_models, self._service, on_done=self._on_models_listed)

    def image_refusal(self) -> str | None:
        """Why the chosen model takes no images, with the fix (None: it takes them)."""
        model_id = self.current_model_id()
        m = self._models.get(model_id) if model_id is not None else None
        if m is None or m.vision:
            return None
        return (
            f"{m.id} cannot see images: it has no vision projector. Pick a vision model (one "
            f"with a projector, e.g. pulled with its mmproj file) to send images."
        )

    def send(self, text: str, images: Sequence[ChatImage] | None = None) -> bool:
        """Send a user message with ``images`` (default: the images attached in the bar) and
        stream the answer. Returns False when nothing was sent."""
        text = text.strip()
        model_id = self.current_model_id()
        pending = self.attachments.images if images is None else list(images)
        if (not text and not pending) or self.streaming:
            return False
        if model_id is None:
            if self._no_model_notice is None:
                self._no_model_notice = self.transcript.add_notice(NO_MODEL_NOTICE, "error").msg_id
            return False
        problem = self.options.schema_problem()
        if problem:  # not sent: the text stays in the box
            self.options_button.setChecked(True)
            self.attachments.say(problem)
            return False
        refusal = self.image_refusal() if pending or has_sources(self.history) else None
        if refusal:  # not sent: the text stays in the box, the images in the bar
            self.attachments.say(refusal)
            return False
        if images is None:
            self.attachments.take_images()
        msg_id = self._new_id("u")
        self.history.append(user_message(text, pending))
        self.history_ids.append(msg_id)
        view = self.transcript.add_message(msg_id, "user", text, header="You")
        view.set_files([a.name for a in self.attachments.attachments])
        if pending:
            view.set_images(pending)
            if self.session is not None:  # saved with the question (extras.images)
                self.session.keep_images(pending)
        self.transcript.scroll_to_end()  # sending follows the answer, even after scrolling up
        self._ask(model_id)
        return True

    def regenerate(self, msg_id: str) -> bool:
        """Drop that answer (and what follows it) and ask for it again."""
        i = self._history_index(msg_id)
        model_id = self.current_model_id()
        if i is None:  # an answer that failed (not in the history): ask its question again
            return self._retry(msg_id)
        if self.streaming or model_id is None or self.history[i].role != "assistant":
            return False
        self._truncate(i)
        self._ask(model_id)
        return True

    def edit_and_resend(self, msg_id: str, text: str) -> bool:
        """Replace that user message with ``text``, dropping what follows, and send it."""
        view = self.transcript.message(msg_id)
        images = list(view.images) if view is not None else []  # they go again with it
        if self.streaming or not (text.strip() or images) or self.current_model_id() is None:
            return False
        i = self._history_index(msg_id)
        if i is not None:
            self._truncate(i)
        else:  # a message whose turn failed: shown, no longer in the history
            self.transcript.remove_from(msg_id)
        return self.send(text, images)

    def delete_message(self, msg_id: str) -> None:
        """Remove one message from the conversation (not the answer in flight)."""
        if self._answer_view is not None and self._answer_view.msg_id == msg_id:
            return
        keep = [k for k, x in enumerate(self.history_ids) if x != msg_id]  # with its tool calls
        self.history[:] = [self.history[k] for k in keep]
        self.history_ids[:] = [self.history_ids[k] for k in keep]
        self.transcript.remove(msg_id)

    def _ask(self, model_id: str) -> None:
        """Stream an answer to the history as it stands (it ends with the user's turn)."""
        system = self.options.system_prompt().strip()
        messages = ([ChatMessage("system", system)] if system else []) + self.history
        self._answer_view = self.transcript.add_message(
            self._new_id("a"), "assistant", header=f"Assistant · {model_id}"
        )
        self._answer_parts = []
        self._thinking = False
        self.stats_label.setText("Waiting for the model…")

        tools = self.mcp.active()  # MCP: the tool loop answers when tools are on
        turn: Any = self.mcp.new_turn() if tools else AnswerTurn()
        self._turn = turn
        max_tokens = self.options.max_tokens()
        self._sent_text = self.history[-1].content if self.history else ""
        # attachments; images decoded for the model
        prepare = self.attachments.preparer(model_id, max_tokens, images=has_sources(messages))
        sampling = self.options.sampling()
        busy = partial(self._cpu_busy_streamed.emit, turn)
        stop, shape = self.options.stop(), self.options.constraint()
        run = (
            self.mcp.answer
            if tools
            else partial(
                stream_answer, self._service, on_cpu_busy=busy, stop=stop, constraint=shape
            )
        )
        self._bridge.run(
            run(
                turn,
                partial(self._text_streamed.emit, turn),
                model_id,
                messages,
                sampling,
                max_tokens,
                partial(self._reasoning_streamed.emit, turn),
                prepare=prepare,
            ),
            on_done=partial(self._on_turn_done, turn),
            on_error=partial(self._on_turn_failed, turn),
        )
        self._update_buttons()
        self.answer_started.emit()

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
        self.history_ids.clear()
        self.mcp.new_chat()  # MCP: switches back on, "always" forgotten
        self._answer_parts = []
        self.attachments.clear()
        self.transcript.clear()
        self.meter.reset()
        self.stats_label.clear()
        self.conversation_cleared.emit()

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

    def _on_session_options_restored(self, system_prompt: str, params: dict[str, Any]) -> None:
        self.system_edit.setPlainText(system_prompt)
        self.options.set_params(params)

    def _on_model_combo_activated(self, _index: int) -> None:
        """The user picked a model: it is the one chosen next time the app starts."""
        mid = self.current_model_id()
        self.options.model_id = mid
        store = self._settings
        if mid is not None and store is not None:
            self._bridge.call(remember_model, store, mid)

    def _on_models_listed(self, models: list[ChatModel]) -> None:
        self._models = {m.id: m for m in models}
        last = self._settings.load().chat.last_model if self._settings is not None else ""
        fill_picker(self.model_combo, models, (self.current_model_id(), last))
        self.options.model_id = self.current_model_id()
        self.model_combo.setPlaceholderText("No chat models: import one on the Library page")
        if models and self._no_model_notice is not None:  # a model came: the advice is stale
            self.transcript.remove(self._no_model_notice)
            self._no_model_notice = None
        self._update_buttons()
        self.models_refreshed.emit()

    def _on_self_reasoning_streamed(self, turn: AnswerTurn, text: str) -> None:
        """The model's reasoning, shown collapsed apart from the answer; never part of the
        history sent back to it."""
        if turn is not self._turn or self._answer_view is None:
            return
        if not self._thinking:
            self._thinking = True
            self.stats_label.setText("Thinking…")  # only now: this model reasons
        self._answer_view.append_reasoning(text)
        self.reasoning_received.emit(text)

    def _on_self_cpu_busy_streamed(self, turn: AnswerTurn) -> None:
        """Say why this answer is slow, once, above it (under its header): put in the stream's
        own place it would split the answer's text in two."""
        if turn is self._turn and self._answer_view is not None:
            self._answer_view.set_caption(CPU_BUSY_NOTICE)

    def _on_self_text_streamed(self, turn: AnswerTurn, text: str) -> None:
        if turn is not self._turn or self._answer_view is None:
            return  # a late chunk of a cleared conversation
        if self._thinking and not self._answer_parts:  # the answer starts below the reasoning
            text = text.lstrip("\n")
            if not text:
                return
        if not self._answer_parts:  # the first token: no longer loading or thinking
            self.stats_label.setText("Answering…")
        self._answer_parts.append(text)
        self._answer_view.append_text(text)
        self.chunk_received.emit(text)

    def _on_turn_done(self, turn: AnswerTurn, final: Delta) -> None:
        if turn is not self._turn:
            return
        answer = self.answer_text
        reason = final.finish_reason or "stop"
        view = self._answer_view
        said = self._record_tool_calls(turn)  # what the answer wrote before its tool calls
        if answer and view is not None:
            self.history.append(ChatMessage("assistant", answer.removeprefix(said)))
            self.history_ids.append(view.msg_id)
        elif self.history and self.history[-1].role == "user":
            self._pop_user()  # nothing came back: keep user/assistant turns alternating
        stats = stats_text(final)
        model_id, usage = self.current_model_id(), final.usage
        if usage is not None and model_id is not None:  # the context meter, for this turn
            self._bridge.call(
                loaded_context,
                self._service,
                model_id,
                on_done=partial(self.meter.set_usage, usage.total_tokens),
            )
        if final.error and reason == "error":
            self._end_answer(f"Error: {final.error}", "error")
        else:
            self._end_answer(stats, "meta")
            self.attachments.answer_done(self)  # "Used: report.pdf p.3, ..."
        self._finish_turn()
        self.answer_finished.emit(reason)

    def _on_turn_failed(self, turn: AnswerTurn, exc: BaseException) -> None:
        if turn is not self._turn:
            return
        text = log_failure(log, "chat failed", exc)
        self._record_tool_calls(turn, kept=False)
        if self.answer_text and self._answer_view is not None:  # what streamed before it failed
            self.history.append(ChatMessage("assistant", self.answer_text))
            self.history_ids.append(self._answer_view.msg_id)
        elif self.history and self.history[-1].role == "user":
            self._pop_user()  # shown (and saved) with its error, not sent to the model again
        self._end_answer(f"Error: {text}", "error")
        self.attachments.turn_failed(self, exc, self._sent_text)  # not sent
        self._finish_turn()
        self.answer_finished.emit("error")

    # -- helpers -------------------------------------------------------------------------------------
    def _with_sidebar(self, transcript: Transcript) -> QWidget:
        """The transcript, with the saved conversations' sidebar on its left when there is
        one, and the settings panel on its right."""
        splitter = QSplitter(Qt.Orientation.Horizontal)
        if self.session is not None:
            splitter.addWidget(self.session.sidebar)
        splitter.addWidget(transcript)
        splitter.addWidget(self.options)
        splitter.setStretchFactor(splitter.indexOf(transcript), 1)
        splitter.setSizes([220, 700, 280] if self.session is not None else [700, 280])
        return splitter

    def _connect_session(self, session: ChatSession) -> None:
        """The session follows the page's turns, clears and model list; it asks the page (its
        signals) to clear, start a new chat, or take a reopened conversation's options."""
        self.answer_started.connect(session.begin_turn)
        self.chunk_received.connect(session.add_chunk)
        self.reasoning_received.connect(session.add_reasoning)
        self.answer_finished.connect(session.end_turn)
        self.turn_dropped.connect(session.drop_turn)
        self.conversation_cleared.connect(session.leave_conversation)
        self.models_refreshed.connect(session.select_wanted_model)
        self.transcript.branch_requested.connect(session.switch_branch)
        self.transcript.delete_requested.connect(session.delete_message)  # after the page's
        # the files a turn carried are saved with its question
        self.attachments.extras_recorded.connect(session.add_turn_extras)
        session.clear_requested.connect(self.clear)
        session.new_chat_requested.connect(self.new_chat)
        session.options_restored.connect(self._on_session_options_restored)
        session.model_restored.connect(self.select_model)

    def _record_tool_calls(self, turn: object, *, kept: bool = True) -> str:
        """MCP: an answer's tool calls and results go in the history before its text (under
        the answer's id, so regenerate and delete take them along) and are saved with it.
        Returns the text the answer wrote with its calls (already in those messages)."""
        added, self.last_extras = self.mcp.finished(turn)
        view = self._answer_view
        if self.last_extras and self.session is not None:
            self.session.add_answer_extras(self.last_extras)
        if not (added and kept and self.answer_text and view is not None):
            return ""
        self.history.extend(added)
        self.history_ids.extend([view.msg_id] * len(added))
        return "".join(m.content for m in added if m.role == "assistant")

    def _place_block(self, block: QWidget) -> None:
        if self._answer_view is not None:
            self._answer_view.add_block(block)

    def _mcp_notice(self, text: str) -> None:
        if self._answer_view is not None:
            self._answer_view.set_caption(text)
        else:
            self.transcript.add_notice(text, "meta")

    def _retry(self, msg_id: str) -> bool:
        ids = self.transcript.ids()
        k = ids.index(msg_id) if msg_id in ids else 0
        question = self.transcript.message(ids[k - 1]) if k > 0 else None
        if question is None or question.role != "user":
            return False
        if self.streaming or self.current_model_id() is None:
            return False
        self.turn_dropped.emit(question.msg_id)  # the new try replaces the failed one
        return self.edit_and_resend(question.msg_id, question.markdown())

    def _new_id(self, prefix: str) -> str:
        return f"{prefix}{next(self._ids)}"

    def _history_index(self, msg_id: str) -> int | None:
        return self.history_ids.index(msg_id) if msg_id in self.history_ids else None

    def _truncate(self, i: int) -> None:
        """Drop history[i:] and its messages (and any shown below them)."""
        self.transcript.remove_from(self.history_ids[i])
        del self.history[i:], self.history_ids[i:]

    def _pop_user(self) -> None:
        self.history.pop()
        self.history_ids.pop()

    def _end_answer(self, notice: str, kind: str) -> None:
        """The answer's last render, with its stats or error under it (and in the status)."""
        if self._answer_view is not None:
            self._answer_view.finish()
            self._answer_view.set_notice(notice, kind)
        self.stats_label.setText(notice)

    def _finish_turn(self) -> None:
        # Stop (clicked or Esc) ends here: its button goes grey and Qt would pass the focus on
        # to the next widget (the conversation search); the user's next move is to type
        stopping = self.stop_button.hasFocus()
        self._turn = None
        self._answer_view = None
        self._update_buttons()
        if stopping:
            self.prompt_edit.setFocus()

    def _update_buttons(self) -> None:
        busy = self.streaming
        self.send_button.setEnabled(not busy and self.model_combo.count() > 0)
        self.stop_button.setEnabled(busy)
        self.model_combo.setEnabled(not busy)
        self.transcript.set_actions_enabled(not busy)
