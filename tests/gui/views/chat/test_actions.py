"""The Chat page's per-message actions and rendering through the real page path: the real
service and worker with a scripted engine (tests/support/fakes.py) that streams a markdown answer
in small pieces. SmolLM2 drives the same page in test_page.py."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QTextTable
from pytestqt.qtbot import QtBot

from app.core.types import ChatMessage, Runtime
from app.gui.main_window import MainWindow
from app.gui.views.chat.page import ChatPage
from tests.gui.helpers import SLOW
from tests.support.fakes import FakeRuntime
from tests.support.gguf_files import write_model

ANSWER = (
    "Sure. **Two** languages:\n\n| Lang | Year |\n|---|---|\n| Python | 1991 |\n| C | 1972 |\n\n"
    "```python\nprint('hi')  # greet\n```\n\nThat is all.\n"
)
PIECES = tuple(ANSWER[i : i + 4] for i in range(0, len(ANSWER), 4))


@pytest.fixture
def runtime() -> FakeRuntime:
    return FakeRuntime(delay=0.0, pieces=PIECES)


@pytest.fixture
def gui_runtimes(runtime: FakeRuntime) -> dict[str, Runtime]:
    return {"gguf": cast(Runtime, runtime)}


@pytest.fixture
def page(window: MainWindow, qtbot: QtBot, tmp_path: Path) -> ChatPage:
    window.library_page.import_files([str(write_model(tmp_path / "Tiny-Q8_0.gguf"))])
    qtbot.waitUntil(lambda: window.library_page.table_model.rowCount() == 1, timeout=10_000)
    window.show_page("Chat")
    p = window.chat_page
    p.refresh_models()
    qtbot.waitUntil(lambda: p.current_model_id() is not None, timeout=10_000)
    return p


def ask(page: ChatPage, qtbot: QtBot, text: str) -> None:
    with qtbot.waitSignal(page.answer_finished, timeout=SLOW) as done:
        assert page.send(text)
    assert done.args[0] == "stop"


def test_a_streamed_markdown_answer_is_rendered(page: ChatPage, qtbot: QtBot) -> None:
    ask(page, qtbot, "Languages?")
    assert page.history == [ChatMessage("user", "Languages?"), ChatMessage("assistant", ANSWER)]
    view = page.transcript.messages()[-1]
    assert page.transcript.last_message("assistant") is view  # the answer that just ended
    assert page.transcript.last_message("user") is page.transcript.messages()[0]
    assert view.markdown() == ANSWER
    docs = view.body.documents()
    assert any(isinstance(f, QTextTable) for d in docs for f in d.rootFrame().childFrames())
    shown = view.body.plain_text()
    assert "Two languages" in shown and "**" not in shown and "print('hi')" in shown
    assert view.body.incremental.frozen_blocks >= 3  # rendered block by block as it came


def test_delete_regenerate_and_edit_and_resend(page: ChatPage, qtbot: QtBot) -> None:
    ask(page, qtbot, "First?")
    ask(page, qtbot, "Second?")
    ids = page.transcript.ids()
    assert ids == page.history_ids and len(ids) == 4

    # Regenerate the last answer (its button): dropped, asked again with the same history
    old = page.transcript.message(ids[3])
    assert old is not None
    with qtbot.waitSignal(page.answer_finished, timeout=SLOW):
        qtbot.mouseClick(old.regenerate_button, Qt.MouseButton.LeftButton)
    assert page.transcript.message(ids[3]) is None
    assert [m.content for m in page.history] == ["First?", ANSWER, "Second?", ANSWER]
    assert page.transcript.ids() == page.history_ids and page.history_ids[3] != ids[3]

    # Edit the first question and resend: what followed it is dropped
    first = page.transcript.messages()[0]
    qtbot.mouseClick(first.edit_button, Qt.MouseButton.LeftButton)
    first.editor.setPlainText("Edited?")
    with qtbot.waitSignal(page.answer_finished, timeout=SLOW):
        qtbot.mouseClick(first.resend_button, Qt.MouseButton.LeftButton)
    assert page.history == [ChatMessage("user", "Edited?"), ChatMessage("assistant", ANSWER)]
    assert len(page.transcript.ids()) == 2 and page.transcript.ids() == page.history_ids
    assert "Edited?" in page.transcript.plain_text()
    assert "First?" not in page.transcript.plain_text()

    # Delete one message: only it goes, from the screen and from the history
    answer = page.transcript.messages()[1]
    qtbot.mouseClick(answer.delete_button, Qt.MouseButton.LeftButton)
    assert page.history == [ChatMessage("user", "Edited?")]
    assert page.transcript.ids() == page.history_ids


def test_stop_keeps_the_rendered_text_and_actions_wait_for_the_answer(
    page: ChatPage, qtbot: QtBot, runtime: FakeRuntime
) -> None:
    ask(page, qtbot, "Warm up")  # loads the model, whose engine we then hold mid-answer
    runtime.models[-1].engine.hold_at = 4
    chunks: list[str] = []
    page.chunk_received.connect(chunks.append)
    assert page.send("Again")
    qtbot.waitUntil(lambda: len(chunks) == 4, timeout=SLOW)
    views = page.transcript.messages()
    assert not views[0].regenerate_button.isEnabled() and not views[-1].delete_button.isEnabled()
    assert page.regenerate(page.history_ids[1]) is False  # not while an answer streams
    with qtbot.waitSignal(page.answer_finished, timeout=SLOW) as done:
        qtbot.mouseClick(page.stop_button, Qt.MouseButton.LeftButton)
    assert done.args[0] == "cancelled"
    partial = "".join(PIECES[:4])
    assert page.history[-1] == ChatMessage("assistant", partial)
    view = page.transcript.messages()[-1]
    assert view.markdown() == partial and view.body.plain_text() == "Sure. Two la"
    assert "stopped" in view.notice
    assert view.regenerate_button.isEnabled()


def test_regenerate_on_a_failed_answer_asks_its_question_again(
    page: ChatPage, qtbot: QtBot, runtime: FakeRuntime
) -> None:
    runtime.fail_times = 1  # the first load fails: the answer is an error, not history
    with qtbot.waitSignal(page.answer_finished, timeout=SLOW) as done:
        assert page.send("Hello?")
    assert done.args[0] == "error" and page.history == []
    failed = page.transcript.messages()[-1]
    assert failed.notice.startswith("Error:")
    with qtbot.waitSignal(page.answer_finished, timeout=SLOW) as done:
        qtbot.mouseClick(failed.regenerate_button, Qt.MouseButton.LeftButton)
    assert done.args[0] == "stop"
    assert page.history == [ChatMessage("user", "Hello?"), ChatMessage("assistant", ANSWER)]
    assert page.transcript.ids() == page.history_ids  # the failed pair is gone from the screen
