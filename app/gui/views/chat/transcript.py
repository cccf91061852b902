"""The Chat page's transcript: a scrolling column of message widgets, each with its markdown
rendered as it streams, its thinking collapsed apart, a notice line and per-message actions.

API (what the page and the conversation store wire to):

- ``Transcript.add_message(id, role, text, header=..., ...)`` adds a ``MessageView`` at the
  bottom; ``message(id)``, ``remove_from(id)``, ``clear()``, ``plain_text()``.
- ``Transcript`` signals carry the message id: ``regenerate_requested(id)``,
  ``edit_submitted(id, text)``, ``delete_requested(id)``, ``branch_requested(id, -1 | +1)``.
  The transcript changes nothing itself on these: the page decides (and removes views).
- ``MessageView``: ``append_text``, ``append_reasoning``, ``set_text``, ``set_caption`` (a line
  above the body, e.g. the CPU-busy notice), ``set_notice`` (the stats or error line under it),
  ``set_branch``, ``finish``, ``plain_text``, ``markdown`` (the raw text); ``set_images``
  (a user message's thumbnails; ``images`` holds them).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import count
from typing import TYPE_CHECKING

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import (
    QFont,
    QPalette,
    QTextCursor,
)
from PySide6.QtWidgets import (
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QScrollArea,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.gui.theme import pick, theme_signals
from app.gui.views.chat.images import ImageStrip
from app.gui.views.chat.markdown_view import MarkdownBody
from app.gui.views.copied import copy_text, flash_copied

if TYPE_CHECKING:
    from app.core.workspace.chat_images import ChatImage

log = logging.getLogger(__name__)

_KIND_COLORS = {
    "user": ("#0b57d0", "#8ab4f8"),
    "assistant": ("#1a7f37", "#6fdd8b"),
    "error": ("#b3261e", "#f28b82"),
    "meta": ("#6b6b6b", "#a8a8a8"),
}


# a message's background: a faint tint of its role's colour, so turns read apart at a glance
# (text on it keeps WCAG AA contrast in both themes)
_BUBBLE_COLORS = {
    "user": ("#eef3fd", "#1e2836"),
    "assistant": ("#f1f8f3", "#1d2a21"),
}
AVATAR_LETTERS = {"user": "Y", "assistant": "A"}  # You, Assistant


def kind_color(kind: str) -> str:
    light, dark = _KIND_COLORS.get(kind, _KIND_COLORS["meta"])
    return pick(light, dark)


def bubble_color(role: str) -> str:
    """The background of a ``role`` message for the palette in use ("" : none)."""
    light, dark = _BUBBLE_COLORS.get(role, ("", ""))
    return pick(light, dark)


def text_color() -> str:
    """The body text's colour on a message's background."""
    return pick("#1f1f1f", "#e8e8e8")


def _tool(text: str, tip: str) -> QToolButton:
    b = QToolButton()
    b.setText(text)
    b.setToolTip(tip)
    b.setAutoRaise(True)
    return b


@dataclass(frozen=True)
class MessageContent:
    """What a message shows besides its id and role (see :meth:`Transcript.add_message`)."""

    header: str
    text: str = ""
    reasoning: str = ""
    branch: tuple[int, int] | None = None
    notice: str = ""
    notice_kind: str = "meta"
    created: float | None = None


class MessageView(QWidget):
    """One message: header, caption, collapsed thinking, rendered body, notice, actions."""

    copied = Signal()
    regenerate_clicked = Signal()
    edit_submitted = Signal(str)
    delete_clicked = Signal()
    branch_clicked = Signal(int)  # -1 | +1

    def __init__(
        self, msg_id: str, role: str, content: MessageContent, parent: QWidget | None = None
    ) -> None:
        super().__init__(parent)
        text, header, reasoning = content.text, content.header, content.reasoning
        branch, notice, notice_kind = content.branch, content.notice, content.notice_kind
        created = content.created
        self.msg_id = msg_id
        self.role = role
        self.created = time.time() if created is None else created
        self._reasoning: list[str] = []
        self._branch: tuple[int, int] | None = None
        self.images: list[ChatImage] = []  # the message's images (a user message's)
        self.image_strip: ImageStrip | None = None
        self.files: list[str] = []  # the names of the files attached to it
        self.setObjectName("message")
        self.setAttribute(Qt.WidgetAttribute.WA_StyledBackground, True)
        self.avatar = QLabel(AVATAR_LETTERS.get(role, ""))
        self.avatar.setFixedSize(28, 28)
        self.avatar.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.files_label = self._muted_label()

        stamp = _stamp(self.created)
        self.header_label = QLabel(f"{header}  ·  {stamp}" if header else "")
        bold = QFont(self.header_label.font())
        bold.setBold(True)
        self.header_label.setFont(bold)
        self.header_label.setStyleSheet(f"color: {kind_color(role)}")

        self.caption_label = self._muted_label()
        self.thinking_button = QToolButton()
        self.thinking_button.setCheckable(True)
        self.thinking_button.setAutoRaise(True)
        self.thinking_button.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.thinking_button.setArrowType(Qt.ArrowType.RightArrow)
        self.thinking_button.hide()
        self.reasoning_view = QPlainTextEdit()
        self.reasoning_view.setReadOnly(True)
        italic = QFont(self.reasoning_view.font())
        italic.setItalic(True)
        self.reasoning_view.setFont(italic)
        self.reasoning_view.setForegroundRole(QPalette.ColorRole.PlaceholderText)
        self.reasoning_view.setMaximumHeight(160)
        self.reasoning_view.hide()  # collapsed until the toggle opens it

        self.body = MarkdownBody()
        self.notice_label = self._muted_label()

        self.copy_button = _tool("Copy", "Copy this message's text (markdown)")
        self.regenerate_button = _tool("Regenerate", "Ask for this answer again")
        self.edit_button = _tool("Edit", "Edit this message and send it again")
        self.delete_button = _tool("Delete", "Delete this message")
        self.prev_button = _tool("‹", "Previous version")
        self.next_button = _tool("›", "Next version")
        self.branch_label = QLabel("")
        actions = QHBoxLayout()
        actions.setContentsMargins(0, 0, 0, 0)
        for tool in (self.prev_button, self.branch_label, self.next_button):
            actions.addWidget(tool)
        actions.addStretch(1)
        for b in (self.copy_button, self.regenerate_button, self.edit_button, self.delete_button):
            actions.addWidget(b)
        self.actions_row = QWidget()
        self.actions_row.setLayout(actions)

        self.editor = QPlainTextEdit()
        self.editor.setFixedHeight(72)
        self.resend_button = QPushButton("Resend")
        self.cancel_edit_button = QPushButton("Cancel")
        edit_row = QHBoxLayout()
        edit_row.setContentsMargins(0, 0, 0, 0)
        edit_row.addWidget(self.editor, 1)
        edit_buttons = QVBoxLayout()
        edit_buttons.addWidget(self.resend_button)
        edit_buttons.addWidget(self.cancel_edit_button)
        edit_row.addLayout(edit_buttons)
        self.edit_box = QWidget()
        self.edit_box.setLayout(edit_row)
        self.edit_box.hide()

        head = QHBoxLayout()
        head.setContentsMargins(0, 0, 0, 0)
        head.setSpacing(8)
        head.addWidget(self.avatar)
        head.addWidget(self.header_label, 1)
        self.header_row = QWidget()
        self.header_row.setLayout(head)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(12, 10, 12, 10)
        lay.setSpacing(4)
        parts: tuple[QWidget, ...] = (
            self.header_row,
            self.files_label,
            self.caption_label,
            self.thinking_button,
            self.reasoning_view,
            self.body,
            self.edit_box,
            self.notice_label,
            self.actions_row,
        )
        for part in parts:
            lay.addWidget(part)
        # visibility only now that every part has a parent: shown parentless, a widget would
        # open as a window of its own (and take the main window's focus)
        self.header_label.setVisible(bool(header))
        self.avatar.setVisible(bool(header) and role in AVATAR_LETTERS)
        self.header_row.setVisible(bool(header))
        self.regenerate_button.setVisible(role == "assistant")
        self.edit_button.setVisible(role == "user")
        self.actions_row.setVisible(role in ("user", "assistant"))

        self.thinking_button.toggled.connect(self._on_thinking_button_toggled)
        self.copy_button.clicked.connect(self._on_copy_button_clicked)
        self.regenerate_button.clicked.connect(self.regenerate_clicked)
        self.edit_button.clicked.connect(self._on_edit_button_clicked)
        self.delete_button.clicked.connect(self.delete_clicked)
        self.prev_button.clicked.connect(self._on_prev_button_clicked)
        self.next_button.clicked.connect(self._on_next_button_clicked)
        self.resend_button.clicked.connect(self._on_resend_button_clicked)
        self.cancel_edit_button.clicked.connect(self._on_cancel_edit_button_clicked)

        self.body.code_copied.connect(self._on_body_code_copied)
        self._notice_kind = notice_kind
        self._style()
        self.set_branch(branch)
        if text:
            self.set_text(text)
        if reasoning:
            self.append_reasoning(reasoning)
        self.set_notice(notice, notice_kind)

    @staticmethod
    def _muted_label() -> QLabel:
        label = QLabel("")
        label.setWordWrap(True)
        label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        label.hide()
        return label

    # -- content -----------------------------------------------------------------------------------
    def markdown(self) -> str:
        """The message's raw text (what Copy puts on the clipboard)."""
        return self.body.markdown

    @property
    def reasoning(self) -> str:
        return "".join(self._reasoning)

    def append_text(self, text: str) -> None:
        """Stream more of the body; rendered at most ~30 times a second."""
        self.body.append(text)

    def set_text(self, text: str) -> None:
        """Replace the body (rendered at once)."""
        self.body.set_text(text)

    def append_reasoning(self, text: str) -> None:
        """Stream more thinking: shown apart, collapsed under "Thinking (N words)"."""
        self._reasoning.append(text)
        self.reasoning_view.moveCursor(QTextCursor.MoveOperation.End)
        self.reasoning_view.insertPlainText(text)
        words = len(self.reasoning.split())
        self.thinking_button.setText(f"Thinking ({words} word{'s' if words != 1 else ''})")
        self.thinking_button.show()

    @property
    def thinking_expanded(self) -> bool:
        return self.thinking_button.isChecked()

    def set_thinking_expanded(self, on: bool) -> None:
        self.thinking_button.setChecked(on)

    def add_block(self, widget: QWidget) -> None:
        """Put a widget (an MCP tool call's block) above the body: the calls come before the
        text the model wrote with their results."""
        lay = self.layout()
        if isinstance(lay, QVBoxLayout):
            lay.insertWidget(lay.indexOf(self.body), widget)

    def set_images(self, images: Sequence[ChatImage]) -> None:
        """Show the message's images as thumbnails above its text (a click opens one)."""
        if self.image_strip is not None:
            self.image_strip.deleteLater()
            self.image_strip = None
        self.images = list(images)
        if self.images:
            self.image_strip = ImageStrip(self.images)
            self.add_block(self.image_strip)

    def set_files(self, names: Sequence[str]) -> None:
        """Name the files attached to the message, above its text."""
        self.files = list(names)
        shown = "Attached: " + ", ".join(self.files) if self.files else ""
        self._show_muted(self.files_label, shown, "meta")

    def set_caption(self, text: str) -> None:
        """A dimmed, italic line above the body (e.g. why this answer is slow)."""
        self._show_muted(self.caption_label, text, "meta")

    def set_notice(self, text: str, kind: str = "meta") -> None:
        """The line under the body: stats (``meta``, dimmed italic) or an ``error``."""
        self._notice_kind = kind
        self._show_muted(self.notice_label, text, kind)

    @property
    def notice(self) -> str:
        return self.notice_label.text()

    def set_branch(self, branch: tuple[int, int] | None) -> None:
        """Show "‹ i/n ›" (1-based ``i`` of ``n`` versions) when there is more than one."""
        self._branch = branch
        shown = branch is not None and branch[1] > 1
        for w in (self.prev_button, self.branch_label, self.next_button):
            w.setVisible(shown)
        if branch is not None and shown:
            i, n = branch
            self.branch_label.setText(f"{i}/{n}")
            self.prev_button.setEnabled(i > 1)
            self.next_button.setEnabled(i < n)

    def set_actions_enabled(self, on: bool) -> None:
        """Regenerate, Edit, Delete and the branch switcher (off while an answer streams)."""
        for b in (
            self.regenerate_button,
            self.edit_button,
            self.delete_button,
            self.prev_button,
            self.next_button,
        ):
            b.setEnabled(on)
        if on:
            self.set_branch(self._branch)

    def restyle(self) -> None:
        """Re-pick colours and the code style after a theme change."""
        self._style()
        self._show_muted(self.files_label, self.files_label.text(), "meta")
        self._show_muted(self.caption_label, self.caption_label.text(), "meta")
        self._show_muted(self.notice_label, self.notice_label.text(), self._notice_kind)
        self.body.restyle()

    def finish(self) -> None:
        """The stream ended: render what is pending now."""
        self.body.flush()

    def plain_text(self) -> str:
        """Header, caption, thinking (even collapsed), body and notice, as lines."""
        parts = [self.header_label.text(), self.files_label.text(), self.caption_label.text()]
        if self._reasoning:
            parts += [self.thinking_button.text(), self.reasoning]
        if self.image_strip is not None:
            parts.append(self.image_strip.text())
        parts += [self.body.plain_text(), self.notice_label.text()]
        return "\n".join(p for p in parts if p)

    # -- helpers and slots ---------------------------------------------------------------------------
    def _show_muted(self, label: QLabel, text: str, kind: str) -> None:
        label.setText(text)
        font = QFont(label.font())
        font.setItalic(kind == "meta")
        label.setFont(font)
        label.setStyleSheet(f"color: {kind_color(kind)}")
        label.setVisible(bool(text))

    def _on_thinking_button_toggled(self, on: bool) -> None:
        self.reasoning_view.setVisible(on)
        self.thinking_button.setArrowType(Qt.ArrowType.DownArrow if on else Qt.ArrowType.RightArrow)

    def _style(self) -> None:
        """The role's colours: header, avatar, and the message's tinted background."""
        color = kind_color(self.role)
        self.header_label.setStyleSheet(f"color: {color}")
        self.avatar.setStyleSheet(
            f"background-color: {color}; color: {pick('#ffffff', '#202124')};"
            " border-radius: 14px; font-weight: bold"
        )
        bg = bubble_color(self.role)
        self.setStyleSheet(
            f"#message {{ background-color: {bg}; border-radius: 8px; }}" if bg else ""
        )

    def _on_body_code_copied(self) -> None:
        flash_copied(self.copy_button, "Copied code")

    def _on_copy_button_clicked(self) -> None:
        copy_text(self.markdown(), self.copy_button)
        self.copied.emit()

    def _on_edit_button_clicked(self) -> None:
        self.editor.setPlainText(self.markdown())
        self.edit_box.show()
        self.body.hide()
        self.editor.setFocus()

    def _on_resend_button_clicked(self) -> None:
        text = self.editor.toPlainText().strip()
        if text:
            self._close_editor()
            self.edit_submitted.emit(text)

    def _on_cancel_edit_button_clicked(self) -> None:
        self._close_editor()

    def _close_editor(self) -> None:
        self.edit_box.hide()
        self.body.show()

    def _on_prev_button_clicked(self) -> None:
        self.branch_clicked.emit(-1)

    def _on_next_button_clicked(self) -> None:
        self.branch_clicked.emit(+1)


class Transcript(QScrollArea):
    """The conversation as a column of ``MessageView``s; follows the stream at the bottom
    unless the user scrolled up. Actions are reported by message id; the owner acts."""

    regenerate_requested = Signal(str)  # message id
    edit_submitted = Signal(str, str)  # message id, new text
    delete_requested = Signal(str)  # message id
    branch_requested = Signal(str, int)  # message id, -1 | +1
    copied = Signal(str)  # message id

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWidgetResizable(True)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        inner = QWidget()
        self._column = QVBoxLayout(inner)
        self._column.setContentsMargins(12, 8, 12, 8)
        self._column.setSpacing(14)
        self.placeholder = QLabel("Pick a model, type a message below and press Enter.")
        self.placeholder.setForegroundRole(QPalette.ColorRole.PlaceholderText)
        self._column.addWidget(self.placeholder)
        self._column.addStretch(1)
        self.setWidget(inner)
        self._views: dict[str, MessageView] = {}
        self._order: list[str] = []
        self._notices = count(1)
        self.follow = True  # at the bottom: new content scrolls into view
        bar = self.verticalScrollBar()
        bar.valueChanged.connect(self._on_bar_value_changed)
        bar.rangeChanged.connect(self._on_bar_range_changed)
        theme_signals().changed.connect(self._on_theme_changed)

    # -- API ---------------------------------------------------------------------------------------
    def clear(self) -> None:
        """Remove every message."""
        if self._order:
            self.remove_from(self._order[0])
        self.follow = True

    def add_message(
        self,
        msg_id: str,
        role: str,
        text: str = "",
        *,
        header: str,
        reasoning: str = "",
        branch: tuple[int, int] | None = None,
        notice: str = "",
        notice_kind: str = "meta",
        created: float | None = None,
    ) -> MessageView:
        """Add a message at the bottom and return its view.

        Args:
            msg_id: unique among the shown messages (the store's id, or any string).
            role: ``user`` or ``assistant`` (with actions), or ``notice`` (a bare line).
            text: the markdown body so far (stream more with ``MessageView.append_text``).
            header: e.g. ``You`` or ``Assistant · MODEL``; the time is added.
            reasoning: the thinking so far, shown collapsed.
            branch: ``(i, n)``: this is version i (1-based) of n; "‹ i/n ›" when n > 1.
            notice: the line under the body; ``notice_kind`` ``meta`` (stats) or ``error``.
            created: when it was written (a reopened message), else now.
        Raises:
            ValueError: a message with ``msg_id`` is already shown.
        """
        if msg_id in self._views:
            raise ValueError(f"message {msg_id!r} is already in the transcript")
        content = MessageContent(header, text, reasoning, branch, notice, notice_kind, created)
        view = MessageView(msg_id, role, content)
        view.regenerate_clicked.connect(lambda: self.regenerate_requested.emit(msg_id))
        view.edit_submitted.connect(lambda t: self.edit_submitted.emit(msg_id, t))
        view.delete_clicked.connect(lambda: self.delete_requested.emit(msg_id))
        view.branch_clicked.connect(lambda d: self.branch_requested.emit(msg_id, d))
        view.copied.connect(lambda: self.copied.emit(msg_id))
        self._column.insertWidget(self._column.count() - 1, view)  # above the stretch
        view.show()  # now, not when the layout gets to it: callers look at it at once
        self._views[msg_id] = view
        self._order.append(msg_id)
        self.placeholder.hide()
        return view

    def add_notice(self, text: str, kind: str = "meta") -> MessageView:
        """A bare line (no header, no actions), e.g. "Import a model first"."""
        return self.add_message(
            f"notice-{next(self._notices)}", "notice", header="", notice=text, notice_kind=kind
        )

    def message(self, msg_id: str) -> MessageView | None:
        return self._views.get(msg_id)

    def last_message(self, role: str = "assistant") -> MessageView | None:
        """The lowest message of ``role`` (e.g. the answer that just ended), if any."""
        return next((v for v in reversed(self.messages()) if v.role == role), None)

    def ids(self) -> list[str]:
        """The shown messages' ids, top to bottom."""
        return list(self._order)

    def messages(self) -> list[MessageView]:
        return [self._views[i] for i in self._order]

    def remove(self, msg_id: str) -> None:
        """Remove one message (those below it stay)."""
        view = self._views.pop(msg_id, None)
        if view is None:
            return
        self._order.remove(msg_id)
        self._column.removeWidget(view)
        view.hide()
        view.deleteLater()
        self.placeholder.setVisible(not self._order)

    def remove_from(self, msg_id: str) -> None:
        """Remove that message and every message below it."""
        if msg_id not in self._views:
            return
        for i in self._order[self._order.index(msg_id) :]:
            self.remove(i)

    def set_actions_enabled(self, on: bool) -> None:
        """Per-message actions on or off for every message (off while an answer streams)."""
        for v in self._views.values():
            v.set_actions_enabled(on)

    def scroll_to_end(self) -> None:
        """Jump to the newest message and follow the stream again (the user sent one)."""
        self.follow = True
        self.verticalScrollBar().setValue(self.verticalScrollBar().maximum())

    def plain_text(self) -> str:
        """Every message's text, top to bottom ("" when empty)."""
        return "\n\n".join(v.plain_text() for v in self.messages())

    def _on_theme_changed(self) -> None:
        for v in self._views.values():
            v.restyle()

    # -- following the stream --------------------------------------------------------------------------
    def _on_bar_value_changed(self, value: int) -> None:
        self.follow = value >= self.verticalScrollBar().maximum() - 4

    def _on_bar_range_changed(self, _lo: int, hi: int) -> None:
        if self.follow:
            self.verticalScrollBar().setValue(hi)


def _stamp(created: float) -> str:
    """A message's time: ``14:05`` today, with the date on other days."""
    t = time.localtime(created)
    return time.strftime("%H:%M" if t[:3] == time.localtime()[:3] else "%Y-%m-%d %H:%M", t)
