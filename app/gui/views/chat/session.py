"""Saved conversations on the Chat page: the sidebar's list, each answer saved as it streams
and when it ends (Stop included), reopening, and branches.

The page keeps doing what it did (``history`` is what is sent to the model, its Transcript
shows it); this module mirrors each turn into a ``Conversation`` tree and saves it. The page's
regenerate and edit-and-resend drop the old turn from ``history``; here the new message is
added as a sibling, so the old one stays in the tree, one "‹ i/n ›" click away. Switching a
branch or deleting a message re-shows the selected path and makes it the page's ``history``.

The session never imports the page: it sees it as a ``ChatHost`` (the few things it reads), the
page connects its own signals to the session's public methods, and the session asks the page to
clear, start a new chat or take a saved conversation's options and model through its signals.
The page places the sidebar (``sidebar``) beside its transcript.

Images are kept in the data folder's ``chat-images/``, one file per content, referenced from the
question's ``extras["images"]``; reopened, they are shown again and go back to the model with
the history. Image files no stored message references are removed when the page starts and once
a deleted conversation's undo window has passed.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from PySide6.QtCore import QObject, QTimer, Signal
from PySide6.QtWidgets import QWidget

from app.core.inference.images import strip_markers
from app.core.types import ChatMessage
from app.core.workspace.chat_images import (
    IMAGES_FOLDER,
    ChatImage,
    ImageStore,
    image_refs,
    user_message,
)
from app.core.workspace.conversations import Conversation, ConversationStore, Message
from app.core.workspace.mcp.toolloop import messages_from_extras
from app.errors import HearthError, NotFound
from app.gui.views.chat.conversation_list import ConversationList
from app.gui.views.chat.transcript import MessageView, Transcript

log = logging.getLogger(__name__)

SAVE_EVERY_CHUNKS = 32  # a streaming answer is saved after each batch of this many chunks


def open_store(path: Path) -> ConversationStore | None:
    """The conversation store, or None (logged) when the file cannot be used: the Chat page
    then works as before, unsaved."""
    try:
        return ConversationStore(path)
    except (HearthError, OSError, sqlite3.Error) as e:
        log.warning("conversations are not saved: %s", e)
        return None


def failed(m: Message) -> bool:
    """An answer that brought nothing back (an error, or stopped before any text)."""
    return m.role == "assistant" and not m.content and not m.extras.get("tool_calls")


class ChatHost(Protocol):
    """The Chat page as the session sees it: the history sent to the model (rebuilt when a
    saved path is shown), the transcript that shows it, and what a conversation saves."""

    history: list[ChatMessage]
    history_ids: list[str]  # history[i]'s message id: its view in the transcript

    @property
    def transcript(self) -> Transcript: ...

    @property
    def streaming(self) -> bool: ...

    @property
    def answer_text(self) -> str:
        """The answer being streamed (or the last one)."""
        ...

    def current_model_id(self) -> str | None: ...

    def offers_model(self, model_id: str) -> bool:
        """Whether the model picker lists ``model_id`` (now)."""
        ...

    def chat_options(self) -> tuple[str, dict[str, Any]]:
        """The system prompt and the sampling parameters, as a conversation keeps them."""
        ...

    def saved_blocks(self, extras: dict[str, Any]) -> Sequence[QWidget]:
        """A saved answer's MCP tool call blocks, from its ``extras``."""
        ...


class ChatSession(QObject):
    """Keeps the page's conversation in the store and the sidebar in step with it."""

    clear_requested = Signal()  # a saved conversation replaces the page's: clear it first
    new_chat_requested = Signal()
    options_restored = Signal(str, object)  # a reopened conversation's system prompt, params
    model_restored = Signal(str)  # ... and its model, once the picker lists it

    def __init__(
        self, host: ChatHost, store: ConversationStore, parent: QObject | None = None
    ) -> None:
        super().__init__(parent)
        self.host = host
        self.store = store
        self.sidebar = ConversationList(store)
        self.images = ImageStore(store.path.parent / IMAGES_FOLDER)
        self.conversation: Conversation | None = None
        self._ids: dict[str, str] = {}  # the transcript's message id -> the tree's
        self._answer: tuple[str, str] | None = None  # (view id, parent id) of the turn in flight
        self._answer_msg: str | None = None  # its message in the tree, once it has text
        self._reasoning: list[str] = []
        self._chunks = 0
        self._user_extras: dict[str, Any] = {}  # for the next user message (attachments)
        self._answer_extras: dict[str, Any] = {}  # for the answer in flight (tool calls)
        self._wanted_model: str | None = None  # a reopened conversation's, until it is listed
        self._replacing = False  # the page is being cleared by us, not by the user

        self.sidebar.conversation_opened.connect(self._on_sidebar_conversation_opened)
        self.sidebar.new_chat_requested.connect(self._on_sidebar_new_chat_requested)
        self.sidebar.conversation_deleted.connect(self._on_sidebar_conversation_deleted)
        self.sidebar.conversation_renamed.connect(self._on_sidebar_conversation_renamed)
        self.collect_images()

    # -- actions -------------------------------------------------------------------------------------
    def open(self, conv_id: str) -> None:
        """Show a saved conversation: its selected path, model, system prompt and parameters.
        An answer in flight is stopped and what it had streamed is saved first."""
        self._save_partial()
        try:
            conv = self.store.load(conv_id)
        except HearthError as e:
            log.warning("could not open conversation %s: %s", conv_id, e)
            self.sidebar.refresh()
            return
        self._replace_page()
        self.conversation = conv
        self.options_restored.emit(conv.system_prompt, conv.params)
        if conv.model:
            self._wanted_model = conv.model
            self.select_wanted_model()
        self.show_path()
        self.sidebar.set_current(conv.id)

    def show_path(self) -> None:
        """Show the selected path in the transcript and make it the page's ``history``."""
        conv = self.conversation
        p = self.host
        p.transcript.clear()
        p.history.clear()
        p.history_ids.clear()
        self._ids.clear()
        if conv is None:
            return
        for m in conv.path():
            view = self._show(m)
            if failed(m):  # shown with its error; neither it nor its question goes to the model
                if p.history and p.history[-1].role == "user":
                    del p.history[-1], p.history_ids[-1]
                self._ids[m.id] = m.id
                continue
            if m.role == "assistant" and m.extras.get("tool_calls"):  # MCP: the calls it made
                for block in p.saved_blocks(m.extras):
                    view.add_block(block)
                calls = messages_from_extras(m.extras)
                p.history += calls
                p.history_ids += [m.id] * len(calls)
            files = m.extras.get("attachments") if m.role == "user" else None
            if isinstance(files, list):  # the files it carried, named on it
                view.set_files([str(f.get("name", "")) for f in files if isinstance(f, dict)])
            refs = image_refs(m.extras) if m.role == "user" else []
            if refs:  # shown again, and sent again with the history
                found = [self.images.load(r) for r in refs]
                images = [i for i in found if i is not None]
                view.set_images(images)
                if len(images) < len(refs):
                    view.set_notice(f"{len(refs) - len(images)} image(s) missing", "error")
                p.history.append(user_message(m.content, images))
            else:
                p.history.append(ChatMessage(m.role, m.content))
            p.history_ids.append(m.id)
            self._ids[m.id] = m.id
        p.transcript.set_actions_enabled(not p.streaming)

    def keep_images(self, images: list[ChatImage]) -> None:
        """Store the next question's images and reference them from its ``extras``."""
        refs = []
        for img in images:
            try:
                refs.append(self.images.save(img))
            except OSError as e:  # a full disk: the image is sent, not kept
                log.warning("could not keep image %s: %s", img.name, e)
        if refs:
            self.add_turn_extras({"images": refs})

    def collect_images(self) -> int:
        """Remove the image files no stored message references (conversations purged after
        their undo window no longer count); how many went."""
        try:
            self.store.purge_deleted()
            used = {
                r["file"]
                for v in self.store.extras_values("images")
                for r in image_refs({"images": v})
            }
        except (HearthError, sqlite3.Error) as e:
            log.warning("images not cleaned up: %s", e)
            return 0
        return self.images.remove_unused(used)

    def add_answer_extras(self, extras: dict[str, Any]) -> None:
        """What the answer in flight (or the next one) is saved with: its MCP ``tool_calls``
        and ``tool_results``."""
        self._answer_extras.update(extras)

    def add_turn_extras(self, extras: dict[str, Any]) -> None:
        """Extras for the user message of the turn in flight, known only once it has started
        (the ``attachments`` it carried and the ``chunks_used`` for it); before a turn, for
        the next user message sent."""
        conv, answer = self.conversation, self._answer
        if conv is None or answer is None or answer[1] not in conv:
            self._user_extras.update(extras)  # no turn yet: the next user message
            return
        user = conv.get(answer[1])
        conv.update(user.id, extras={**user.extras, **extras})
        self._save(listed=False)

    def switch_branch(self, view_id: str, step: int) -> None:
        conv, mid = self.conversation, self._ids.get(view_id)
        if conv is None or mid is None or self.host.streaming:
            return
        if conv.switch_branch(mid, step) is not None:
            self.show_path()
            self._save()

    def delete_message(self, view_id: str) -> None:
        """Delete a message and what follows it in the tree (its other branches stay)."""
        conv, mid = self.conversation, self._ids.get(view_id)
        if conv is None or mid is None or mid not in conv or self.host.streaming:
            return
        conv.delete_message(mid)
        self.show_path()
        self._save()

    # -- the page's signals, connected by the page --------------------------------------------------
    def begin_turn(self) -> None:
        """An answer started (``answer_started``): its question goes in the tree (unless it is
        there: a regenerate), and the answer after it as it streams."""
        p = self.host
        view_ids = p.transcript.ids()
        if not view_ids or not p.history_ids:
            return
        answer_view, asked = view_ids[-1], p.history_ids[-1]
        if self.conversation is None:
            self.conversation = Conversation()
        conv = self.conversation
        self._remember_settings()
        parent = self._ids.get(asked)
        if parent is None or parent not in conv:  # a new user message (sent, or an edit)
            # under the message shown above it (a failed turn too: saved as shown)
            before = next(
                (self._ids[v] for v in reversed(view_ids[:-2]) if self._ids.get(v) in conv), None
            )
            user = conv.add(
                before,
                "user",
                strip_markers(p.history[-1].content),  # the images are in extras
                extras=self._user_extras,
            )
            self._user_extras = {}
            self._ids[asked] = parent = user.id
            self._show_branch(asked, user)
        self._answer = (answer_view, parent)
        self._answer_msg = None
        self._reasoning = []
        self._chunks = 0
        self._save()

    def add_reasoning(self, text: str) -> None:
        """The answer in flight reasoned (``reasoning_received``): saved with it."""
        self._reasoning.append(text)

    def add_chunk(self, _: str) -> None:
        """The answer in flight streamed a chunk (``chunk_received``): saved every so often."""
        self._chunks += 1
        if self._answer_msg is None or self._chunks % SAVE_EVERY_CHUNKS == 0:
            self._record_answer(final=False)
            self._save(listed=False)

    def end_turn(self, reason: str) -> None:
        """The answer ended (``answer_finished``): saved as it ended, or dropped with a question
        that got nothing back."""
        if self._answer is None or self.conversation is None:
            return
        # saved as shown: Stop keeps what streamed; an answer that failed (nothing came back)
        # is kept empty with its error, so reopening shows it and Regenerate retries it
        self._record_answer(final=True, reason=reason)
        self._answer = self._answer_msg = None
        self._answer_extras = {}
        self._save()

    def drop_turn(self, view_id: str) -> None:
        """A failed turn is asked again (``turn_dropped``): its question and answer leave the
        tree, the new try takes their place."""
        conv, mid = self.conversation, self._ids.get(view_id)
        if conv is not None and mid is not None and mid in conv:
            conv.delete_message(mid)

    def leave_conversation(self) -> None:
        """The page was cleared (``conversation_cleared``): unless the session cleared it to
        show another, the saved conversation is left as it is and the next message starts a
        new one."""
        if not self._replacing:
            self._save_partial()
            self.conversation = None
            self._wanted_model = None
            self._ids.clear()
            self.sidebar.set_current(None)

    def select_wanted_model(self) -> None:
        """The model picker was filled (``models_refreshed``): a reopened conversation's model
        is chosen once it is listed."""
        if self._wanted_model is not None and self.host.offers_model(self._wanted_model):
            self.model_restored.emit(self._wanted_model)
            self._wanted_model = None

    # -- slots: the sidebar ------------------------------------------------------------------------------
    def _on_sidebar_conversation_opened(self, conv_id: str) -> None:
        self.open(conv_id)

    def _on_sidebar_new_chat_requested(self) -> None:
        self.new_chat_requested.emit()

    def _on_sidebar_conversation_deleted(self, conv_id: str) -> None:
        # its images go once its undo window has passed (unless another message uses them)
        wait_ms = int((self.store.undo_seconds + 1) * 1000)
        QTimer.singleShot(wait_ms, self, self.collect_images)
        if self.conversation is not None and self.conversation.id == conv_id:
            self.conversation = None  # so the page's clear saves nothing back
            self._answer = None
            self.new_chat_requested.emit()

    def _on_sidebar_conversation_renamed(self, conv_id: str, title: str) -> None:
        if self.conversation is not None and self.conversation.id == conv_id:
            self.conversation.title, self.conversation.title_set = title, True

    # -- helpers ---------------------------------------------------------------------------------------
    def _record_answer(self, *, final: bool, reason: str | None = None) -> Message | None:
        """Put the answer in flight (its text so far) in the tree, as the newest child of the
        message it answers."""
        conv, answer = self.conversation, self._answer
        if conv is None or answer is None:
            return None
        view_id, parent = answer
        text, reasoning = self.host.answer_text, "".join(self._reasoning)
        extras = dict(self._answer_extras)
        if final:
            extras["finish_reason"] = reason
            view = self.host.transcript.message(view_id)
            notice = view.notice if view is not None else ""
            if notice:
                extras["stats"] = {"text": notice}
        if self._answer_msg is None or self._answer_msg not in conv:
            if parent not in conv:
                return None
            msg = conv.add(
                parent, "assistant", text, reasoning=reasoning, model=conv.model, extras=extras
            )
            self._answer_msg = msg.id
            self._ids[view_id] = msg.id
            self._show_branch(view_id, msg)
            return msg
        return conv.update(self._answer_msg, content=text, reasoning=reasoning, extras=extras)

    def _show_branch(self, view_id: str, msg: Message) -> None:
        view = self.host.transcript.message(view_id)
        if view is not None and self.conversation is not None:
            view.set_branch(self.conversation.branch(msg.id))

    def _show(self, m: Message) -> MessageView:
        header = "You" if m.role == "user" else f"Assistant · {m.model or ''}".rstrip(" ·")
        stats = m.extras.get("stats")
        notice = stats.get("text", "") if isinstance(stats, dict) else ""
        conv = self.conversation
        header = header if m.role in ("user", "assistant") else m.role.title()
        error = m.extras.get("finish_reason") == "error"
        view = self.host.transcript.add_message(
            m.id,
            m.role,
            m.content,
            header=header,
            reasoning=m.reasoning,
            branch=conv.branch(m.id) if conv is not None else None,
            notice=str(notice),
            notice_kind="error" if error else "meta",
            created=m.created,
        )
        return view

    def _remember_settings(self) -> None:
        conv, p = self.conversation, self.host
        if conv is None:
            return
        conv.model = p.current_model_id()
        conv.system_prompt, conv.params = p.chat_options()

    def _save_partial(self) -> None:
        """An answer in flight that is about to be dropped: keep what it streamed."""
        if self._answer is not None and self.host.answer_text:
            self._record_answer(final=True, reason="cancelled")
        self._answer = None
        self._answer_extras = {}
        self._save()

    def _save(self, *, listed: bool = True) -> None:
        """Save the conversation; ``listed``: and show it in the sidebar as it now is."""
        conv = self.conversation
        if conv is None:
            return
        try:
            if len(conv) == 0:  # its only turn failed: not a conversation to keep
                with contextlib.suppress(NotFound):  # (never saved)
                    self.store.delete(conv.id)
                self.conversation = None  # the next message starts (and names) a new one
                self.sidebar.set_current(None)
                return
            self.store.save(conv)
        except (HearthError, OSError, sqlite3.Error) as e:  # a full disk: log it, keep chatting
            log.warning("could not save conversation %s: %s", conv.id, e)
            return
        if listed or self.sidebar.current_id != conv.id:
            self.sidebar.set_current(conv.id)

    def _replace_page(self) -> None:
        self._replacing = True
        try:
            self.clear_requested.emit()
        finally:
            self._replacing = False
        self._answer = None
