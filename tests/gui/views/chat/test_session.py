"""Saved conversations on the Chat page: saved as answers finish (Stop included),
restored after a restart (model, system prompt, parameters, selected branch), branches made by
regenerate and edit-and-resend and switched with ‹ ›, the history sent being the selected path.
Driven through the real service and worker with a scripted engine whose N-th answer says
"Answer N." (what the model says does not matter here; which answer is shown does)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import cast

import pytest
from PySide6.QtCore import Qt
from pytestqt.qtbot import QtBot

from app.core.types import ChatMessage, Runtime
from app.core.workspace.conversation_export import to_json
from app.core.workspace.conversations import ConversationStore
from app.gui.bridge import Bridge
from app.gui.context import GuiContext
from app.gui.main_window import MainWindow
from app.gui.views.chat.page import ChatPage
from app.gui.views.chat.session import ChatSession
from app.gui.views.chat.transcript import MessageView
from app.runtimes.worker import Sequence
from tests.gui.helpers import SLOW
from tests.support.fakes import FakeRuntime, ScriptEngine
from tests.support.gguf_files import write_model


class NumberedEngine(ScriptEngine):
    """The N-th request it begins is answered "Answer N." in two pieces."""

    def begin(self, seq: Sequence) -> None:
        super().begin(seq)
        seq.engine_state = (0, len(self.begun))  # (pieces written, N)

    def step(self, seqs: list[Sequence]) -> None:
        for s in seqs:
            i, n = s.engine_state
            pieces = (f"Answer {n}", ".")
            if i == self.hold_at:
                continue  # held until Stop cancels it
            if i >= len(pieces):
                s.finish("stop")
            else:
                s.engine_state = (i + 1, n)
                s.emit_text(pieces[i])


class NumberedRuntime(FakeRuntime):
    engine_type = NumberedEngine


@pytest.fixture
def runtime() -> NumberedRuntime:
    return NumberedRuntime(delay=0.0)


@pytest.fixture
def gui_runtimes(runtime: NumberedRuntime) -> dict[str, Runtime]:
    return {"gguf": cast(Runtime, runtime)}


@pytest.fixture
def model_id(window: MainWindow, qtbot: QtBot, tmp_path: Path) -> str:
    window.library_page.import_files([str(write_model(tmp_path / "Tiny-Q8_0.gguf"))])
    qtbot.waitUntil(lambda: window.library_page.table_model.rowCount() == 1, timeout=10_000)
    window.show_page("Chat")
    page = window.chat_page
    page.refresh_models()
    qtbot.waitUntil(lambda: page.current_model_id() is not None, timeout=10_000)
    return str(page.current_model_id())


def session(page: ChatPage) -> ChatSession:
    assert page.session is not None
    return page.session


def finished(page: ChatPage, qtbot: QtBot, start: Callable[[], object]) -> str:
    """Run ``start`` (which begins an answer) and wait for the answer's end; its reason."""
    with qtbot.waitSignal(page.answer_finished, timeout=SLOW) as done:
        start()
    return str(done.args[0])


def ask(page: ChatPage, qtbot: QtBot, text: str) -> str:
    page.prompt_edit.setPlainText(text)
    return finished(
        page, qtbot, lambda: qtbot.mouseClick(page.send_button, Qt.MouseButton.LeftButton)
    )


def shown(page: ChatPage) -> list[str]:
    return [v.markdown() for v in page.transcript.messages() if v.role != "notice"]


def view_of(page: ChatPage, text: str) -> MessageView:
    return next(v for v in page.transcript.messages() if v.markdown() == text)


def test_answers_are_saved_and_come_back_after_a_restart(
    window: MainWindow, qtbot: QtBot, model_id: str, gui_ctx: GuiContext, bridge: Bridge
) -> None:
    page = window.chat_page
    page.system_edit.setPlainText("Answer with numbers.")
    page.temperature_spin.setValue(0.3)
    page.max_tokens_spin.setValue(64)
    assert ask(page, qtbot, "First question") == "stop"
    assert ask(page, qtbot, "Second question") == "stop"
    finished(page, qtbot, view_of(page, "Answer 2.").regenerate_button.click)
    assert shown(page) == ["First question", "Answer 1.", "Second question", "Answer 3."]
    assert view_of(page, "Answer 3.").branch_label.text() == "2/2"
    view_of(page, "Answer 3.").prev_button.click()  # back to version 1/2
    assert shown(page)[-1] == "Answer 2."
    sidebar = session(page).sidebar
    assert sidebar.list_widget.count() == 1
    assert sidebar.list_widget.item(0).text().startswith("First question\n")
    conv_id = sidebar.ids()[0]
    session(page).store.close()  # the app quits

    # the app starts again over the same data folder
    again = ChatPage(
        gui_ctx.service, bridge, conversations=ConversationStore(gui_ctx.paths.conversations_db)
    )
    qtbot.addWidget(again)
    qtbot.waitUntil(lambda: again.current_model_id() is not None, timeout=10_000)
    again.system_edit.setPlainText("something else")
    again.temperature_spin.setValue(1.5)
    s = session(again)
    assert s.sidebar.ids() == [conv_id]
    s.sidebar.list_widget.itemClicked.emit(s.sidebar.list_widget.item(0))
    assert shown(again) == ["First question", "Answer 1.", "Second question", "Answer 2."]
    assert again.system_edit.toPlainText() == "Answer with numbers."
    assert again.temperature_spin.value() == pytest.approx(0.3)
    assert again.max_tokens_spin.value() == 64 and again.current_model_id() == model_id
    assert again.history == [
        ChatMessage("user", "First question"),
        ChatMessage("assistant", "Answer 1."),
        ChatMessage("user", "Second question"),
        ChatMessage("assistant", "Answer 2."),
    ]
    assert view_of(again, "Answer 2.").branch_label.text() == "1/2"
    s.store.close()
    # each message shows when it was written, not when it was shown again
    conv = s.conversation
    assert conv is not None
    first = again.transcript.messages()[0]
    assert first.created == conv.path()[0].created


def prompt_text(runtime: NumberedRuntime) -> str:
    """What the model was last asked, as text (the fake model's tokens are characters)."""
    toks = runtime.models[-1].submitted[-1].prompt_tokens
    return "".join(chr(t - 10) for t in toks if t >= 10)


def test_regenerate_twice_then_switch_to_the_first_answer(
    window: MainWindow, qtbot: QtBot, model_id: str, runtime: NumberedRuntime
) -> None:
    page = window.chat_page
    ask(page, qtbot, "Question")
    finished(page, qtbot, view_of(page, "Answer 1.").regenerate_button.click)
    finished(page, qtbot, view_of(page, "Answer 2.").regenerate_button.click)
    last = view_of(page, "Answer 3.")
    assert last.branch_label.text() == "3/3" and last.prev_button.isVisible()
    last.prev_button.click()
    view_of(page, "Answer 2.").prev_button.click()
    first = view_of(page, "Answer 1.")
    assert first.branch_label.text() == "1/3" and not first.prev_button.isEnabled()
    assert shown(page) == ["Question", "Answer 1."]
    assert page.history == [ChatMessage("user", "Question"), ChatMessage("assistant", "Answer 1.")]
    ask(page, qtbot, "And then?")  # the model is sent the selected path
    sent = prompt_text(runtime)
    assert "Answer 1." in sent and "Answer 2." not in sent and "Answer 3." not in sent
    conv = session(page).conversation
    assert conv is not None and len(conv) == 6  # question, 3 answers, follow-up, its answer
    first = view_of(page, "Answer 1.")
    first.next_button.click()  # the other branches have no follow-up
    assert shown(page) == ["Question", "Answer 2."]


def test_edit_and_resend_makes_a_new_user_branch(
    window: MainWindow, qtbot: QtBot, model_id: str, runtime: NumberedRuntime
) -> None:
    page = window.chat_page
    ask(page, qtbot, "Tell me a number")
    ask(page, qtbot, "Another")
    view = view_of(page, "Another")
    view.edit_button.click()
    view.editor.setPlainText("A different one")
    finished(page, qtbot, view.resend_button.click)
    assert shown(page) == ["Tell me a number", "Answer 1.", "A different one", "Answer 3."]
    assert view_of(page, "A different one").branch_label.text() == "2/2"
    assert "Another" not in prompt_text(runtime)
    view_of(page, "A different one").prev_button.click()
    assert shown(page) == ["Tell me a number", "Answer 1.", "Another", "Answer 2."]
    assert page.history[-1] == ChatMessage("assistant", "Answer 2.")
    stored = session(page).store.load(session(page).conversation.id)  # type: ignore[union-attr]
    assert [m.content for m in stored.path()][-2:] == ["Another", "Answer 2."]


def test_stop_keeps_the_text_so_far_and_delete_removes_a_message(
    window: MainWindow, qtbot: QtBot, model_id: str, runtime: NumberedRuntime
) -> None:
    page = window.chat_page
    ask(page, qtbot, "One")
    runtime.models[-1].engine.hold_at = 1  # the next answer stops after its first piece
    page.prompt_edit.setPlainText("Two")
    qtbot.mouseClick(page.send_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: page.answer_text == "Answer 2", timeout=SLOW)
    s = session(page)
    assert s.conversation is not None
    # saved while it streams (a crash now keeps the text so far)
    assert s.store.load(s.conversation.id).path()[-1].content == "Answer 2"
    assert finished(page, qtbot, page.stop) == "cancelled"
    stored = s.store.load(s.conversation.id)
    last = stored.path()[-1]
    assert (last.content, last.extras["finish_reason"]) == ("Answer 2", "cancelled")
    view_of(page, "Answer 1.").delete_button.click()  # it and what follows it
    assert shown(page) == ["One"] and page.history == [ChatMessage("user", "One")]
    assert [m.content for m in s.store.load(s.conversation.id).messages()] == ["One"]


def test_deleting_the_open_conversation_starts_a_new_chat(
    window: MainWindow, qtbot: QtBot, model_id: str
) -> None:
    page = window.chat_page
    ask(page, qtbot, "Keep me")
    s = session(page)
    conv_id = s.sidebar.ids()[0]
    s.sidebar.delete(conv_id)
    assert shown(page) == [] and page.history == [] and s.conversation is None
    s.sidebar.undo_delete()  # back in the list; not reopened
    assert s.sidebar.ids() == [conv_id] and shown(page) == []
    s.sidebar.list_widget.itemClicked.emit(s.sidebar.list_widget.item(0))
    assert shown(page) == ["Keep me", "Answer 1."]
    s.sidebar.rename(conv_id, "My title")  # while it is open: the next save keeps it
    ask(page, qtbot, "More")
    assert s.store.list()[0].title == "My title"
    qtbot.mouseClick(s.sidebar.new_button, Qt.MouseButton.LeftButton)
    assert shown(page) == [] and s.conversation is None
    ask(page, qtbot, "A new one")
    assert len(s.sidebar.ids()) == 2 and s.sidebar.ids()[1] == conv_id


def test_a_turn_that_fails_is_kept_with_its_error_and_the_chat_goes_on(
    window: MainWindow, qtbot: QtBot, model_id: str, runtime: NumberedRuntime
) -> None:
    page = window.chat_page
    s = session(page)
    runtime.fail_times = 1  # the model's first load fails: nothing comes back
    assert ask(page, qtbot, "Lost") == "error"
    assert page.history == []  # not sent to the model again
    assert len(s.sidebar.ids()) == 1 and len(s.store.list()) == 1  # but saved, as shown
    assert ask(page, qtbot, "Kept") == "stop"
    assert s.conversation is not None and len(s.store.list()) == 1  # the same conversation
    stored = s.store.load(s.conversation.id)
    assert [m.content for m in stored.path()] == ["Lost", "", "Kept", "Answer 1."]
    assert stored.path()[1].extras["finish_reason"] == "error" and stored.title == "Lost"
    assert page.history == [ChatMessage("user", "Kept"), ChatMessage("assistant", "Answer 1.")]


def test_other_parts_extras_are_saved_with_the_turn_and_exported(
    window: MainWindow, qtbot: QtBot, model_id: str
) -> None:
    page = window.chat_page
    s = session(page)
    attachments = [{"name": "notes.md", "kind": "markdown", "chars": 120, "whole": True}]
    s.add_turn_extras({"attachments": attachments})  # before the turn: the next question's
    s.add_answer_extras(
        {"tool_calls": [{"id": "c1", "name": "t__x", "server": "t", "arguments": "{}"}]}
    )
    ask(page, qtbot, "Summarise my notes")
    ask(page, qtbot, "Thanks")  # the next turn carries none
    assert s.conversation is not None
    user, answer, user2, answer2 = s.store.load(s.conversation.id).path()
    assert user.extras == {"attachments": attachments}
    assert answer.extras["tool_calls"][0]["name"] == "t__x"
    assert answer.extras["finish_reason"] == "stop" and "tokens" in answer.extras["stats"]["text"]
    assert user2.extras == {} and "tool_calls" not in answer2.extras
    out = to_json(s.store.load(s.conversation.id))
    assert out["messages"][0]["extras"] == {"attachments": attachments}


def test_opening_another_conversation_mid_answer_keeps_what_streamed(
    window: MainWindow, qtbot: QtBot, model_id: str, runtime: NumberedRuntime
) -> None:
    page = window.chat_page
    s = session(page)
    ask(page, qtbot, "First chat")
    first_id = s.sidebar.ids()[0]
    page.new_chat()
    runtime.models[-1].engine.hold_at = 1
    page.send("Second chat")
    qtbot.waitUntil(lambda: page.answer_text == "Answer 2", timeout=SLOW)
    second = s.conversation
    assert second is not None
    s.open(first_id)  # a click in the sidebar while the answer streams
    assert shown(page) == ["First chat", "Answer 1."] and not page.streaming
    kept = s.store.load(second.id).path()
    assert [m.content for m in kept] == ["Second chat", "Answer 2"]
    assert kept[-1].extras["finish_reason"] == "cancelled"
