"""What the Chat page saves is what it shows, with the real SmolLM2: a failed turn is kept with
its error (and retried in place), no conversation is left behind unlisted, the next message
continues the same conversation, and an answer's stats and a message's attached files come
back when it is reopened."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from pytestqt.qtbot import QtBot

from app.core.workspace.conversations import ConversationStore
from app.gui.bridge import Bridge
from app.gui.context import GuiContext
from app.gui.main_window import MainWindow
from app.gui.views.chat.page import ChatPage
from app.gui.views.chat.session import ChatSession
from app.gui.views.chat.transcript import kind_color
from tests.gui.helpers import SLOW

pytestmark = pytest.mark.model


def session(page: ChatPage) -> ChatSession:
    assert page.session is not None
    return page.session


def ask(page: ChatPage, qtbot: QtBot, text: str) -> str:
    with qtbot.waitSignal(page.answer_finished, timeout=SLOW) as done:
        assert page.send(text)
    return str(done.args[0])


def shown(page: ChatPage) -> list[tuple[str, str, str]]:
    """Each message as the user sees it: role, text, the line under it."""
    return [(v.role, v.markdown(), v.notice) for v in page.transcript.messages()]


def stored_conversations(db: Path) -> int:
    """Every conversation row in the database, listed or not."""
    with sqlite3.connect(db) as c:
        return int(c.execute("SELECT COUNT(*) FROM conversations").fetchone()[0])


def reopened(gui_ctx: GuiContext, bridge: Bridge, qtbot: QtBot) -> ChatPage:
    """The page of an app started again over the same data folder, the conversation open."""
    page = ChatPage(
        gui_ctx.service, bridge, conversations=ConversationStore(gui_ctx.paths.conversations_db)
    )
    qtbot.addWidget(page)
    qtbot.waitUntil(lambda: page.current_model_id() is not None, timeout=10_000)
    s = session(page)
    assert len(s.sidebar.ids()) == 1
    s.sidebar.list_widget.itemClicked.emit(s.sidebar.list_widget.item(0))
    return page


def test_a_failed_turn_is_saved_as_shown_and_the_conversation_goes_on(
    window: MainWindow, qtbot: QtBot, imported: str, gui_ctx: GuiContext, bridge: Bridge
) -> None:
    window.show_page("Chat")
    page = window.chat_page
    qtbot.waitUntil(lambda: page.current_model_id() == imported, timeout=10_000)
    page.max_tokens_spin.setValue(8)
    too_long = "hello " * 3000  # over the 2048-token context the test loads with
    assert ask(page, qtbot, too_long) == "error"
    assert ask(page, qtbot, "Say hi.") in ("stop", "length")
    before = shown(page)
    assert [r for r, _, _ in before] == ["user", "assistant", "user", "assistant"]
    assert before[1][2].startswith("Error: This model's context is 2048 tokens")
    assert "first token" in before[3][2] and "tok/s" in before[3][2]
    db = gui_ctx.paths.conversations_db
    s = session(page)
    assert len(s.store.list()) == 1 and stored_conversations(db) == 1  # one, listed
    s.store.close()

    again = reopened(gui_ctx, bridge, qtbot)
    assert shown(again) == before  # the failed turn with its error, the stats line too
    errored = again.transcript.messages()[1]
    assert errored.notice_label.isVisibleTo(errored)
    assert kind_color("error") in errored.notice_label.styleSheet()
    # the model is sent the turns that worked, not the one it refused
    assert [m.content for m in again.history][0] == "Say hi."
    assert ask(again, qtbot, "Thanks.") in ("stop", "length")  # goes on in the same one
    s2 = session(again)
    assert len(s2.store.list()) == 1 and stored_conversations(db) == 1
    assert s2.conversation is not None
    assert len(s2.store.load(s2.conversation.id).path()) == 6

    # Regenerate on the failed answer asks its question again in its place
    again.max_tokens_spin.setValue(8)
    with qtbot.waitSignal(again.answer_finished, timeout=SLOW) as done:
        errored.regenerate_button.click()
    assert done.args[0] == "error"  # still too long, but once: not a new branch beside it
    stored = s2.store.load(s2.conversation.id).path()
    assert [m.role for m in stored] == ["user", "assistant"]
    assert stored[0].content.startswith("hello hello")
    s2.store.close()


def test_attached_files_are_named_on_their_message_also_after_reopening(
    window: MainWindow,
    qtbot: QtBot,
    imported: str,
    gui_ctx: GuiContext,
    bridge: Bridge,
    tmp_path: Path,
) -> None:
    window.show_page("Chat")
    page = window.chat_page
    qtbot.waitUntil(lambda: page.current_model_id() == imported, timeout=10_000)
    page.max_tokens_spin.setValue(8)
    notes = tmp_path / "notes.md"
    notes.write_text("# Notes\n\nThe meeting is on Tuesday.\n")
    page.attachments.add_paths([str(notes)])
    qtbot.waitUntil(lambda: len(page.attachments.attachments) == 1, timeout=10_000)
    assert ask(page, qtbot, "When is the meeting?") in ("stop", "length")
    question = page.transcript.messages()[0]
    assert question.files == ["notes.md"] and question.files_label.isVisible()
    assert "Attached: notes.md" in page.transcript.plain_text()
    session(page).store.close()

    again = reopened(gui_ctx, bridge, qtbot)
    assert again.transcript.messages()[0].files == ["notes.md"]
    assert "Attached: notes.md" in again.transcript.plain_text()
    session(again).store.close()
