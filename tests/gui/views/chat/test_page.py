"""The Chat page streams real answers from SmolLM2, keeps the conversation, stops, and shows
errors inline."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from pytestqt.qtbot import QtBot

from app.core.types import ChatMessage
from app.gui.main_window import MainWindow
from tests.gui.helpers import SLOW

pytestmark = pytest.mark.model


def _ready(window: MainWindow, qtbot: QtBot, model_id: str) -> None:
    window.show_page("Chat")
    page = window.chat_page
    qtbot.waitUntil(lambda: page.current_model_id() == model_id, timeout=10_000)
    assert page.send_button.isEnabled()


def test_chat_streams_a_real_answer_and_keeps_the_history(
    window: MainWindow, qtbot: QtBot, imported: str
) -> None:
    page = window.chat_page
    _ready(window, qtbot, imported)
    page.temperature_spin.setValue(0.0)
    page.max_tokens_spin.setValue(48)
    chunks: list[tuple[float, str]] = []
    # (still streaming, the answer's text so far, what its rendered body shows) at each chunk
    shown: list[tuple[bool, int, int]] = []

    def on_chunk(text: str) -> None:
        chunks.append((time.monotonic(), text))
        view = page.transcript.messages()[-1]
        shown.append(
            (page.stop_button.isEnabled(), len(view.markdown()), len(view.body.plain_text()))
        )

    page.chunk_received.connect(on_chunk)

    page.prompt_edit.setPlainText("What is the capital of France?")
    with qtbot.waitSignal(page.answer_finished, timeout=SLOW) as done:
        qtbot.mouseClick(page.send_button, Qt.MouseButton.LeftButton)
        assert page.prompt_edit.toPlainText() == ""  # the box empties once sent
        assert page.stop_button.isEnabled() and not page.send_button.isEnabled()
    assert done.args[0] in ("stop", "length")

    # streamed: many pieces, arriving over time, that add up to the answer
    assert len(chunks) > 3
    assert chunks[-1][0] > chunks[0][0]
    # each piece reached the answer's message while it was still running, the text grew, and
    # it was rendered on screen as it streamed (not only at the end)
    assert all(streaming for streaming, _, _ in shown)
    lengths = [n for _, n, _ in shown]
    assert lengths == sorted(lengths) and lengths[0] < lengths[-1]
    assert any(rendered > 0 for _, _, rendered in shown)
    answer = "".join(t for _, t in chunks)
    assert answer.strip() and answer == page.answer_text
    assert page.transcript.messages()[-1].markdown() == answer
    transcript = page.transcript.plain_text()
    assert "What is the capital of France?" in transcript
    assert answer.strip() in transcript
    assert "tok/s" in page.stats_label.text()
    assert "tok/s" in transcript  # the stats line under the answer
    assert page.history == [
        ChatMessage("user", "What is the capital of France?"),
        ChatMessage("assistant", answer),
    ]
    assert page.send_button.isEnabled() and not page.stop_button.isEnabled()
    # chatting loaded the model, and the other pages saw it
    qtbot.waitUntil(lambda: window.library_page.table_model.state_of(imported) == "loaded")

    # a second turn is sent with the first one as context
    page.prompt_edit.setPlainText("And of Italy?")
    with qtbot.waitSignal(page.answer_finished, timeout=SLOW):
        page._on_send_button_clicked()  # what Enter in the prompt box does
    assert [m.role for m in page.history] == ["user", "assistant", "user", "assistant"]
    assert page.history[2].content == "And of Italy?"
    assert page.transcript.plain_text().count("You") == 2

    qtbot.mouseClick(page.clear_button, Qt.MouseButton.LeftButton)
    assert page.history == []
    assert page.transcript.plain_text() == "" and page.transcript.messages() == []
    assert page.stats_label.text() == ""


def test_enter_sends_and_shift_enter_adds_a_line(
    window: MainWindow, qtbot: QtBot, imported: str
) -> None:
    page = window.chat_page
    _ready(window, qtbot, imported)
    page.max_tokens_spin.setValue(4)
    qtbot.keyClicks(page.prompt_edit, "Hi")
    qtbot.keyClick(page.prompt_edit, Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)
    qtbot.keyClicks(page.prompt_edit, "there")
    assert page.prompt_edit.toPlainText() == "Hi\nthere"
    with qtbot.waitSignal(page.answer_finished, timeout=SLOW):
        qtbot.keyClick(page.prompt_edit, Qt.Key.Key_Return)
    assert page.history[0] == ChatMessage("user", "Hi\nthere")


def test_stop_cancels_mid_stream(window: MainWindow, qtbot: QtBot, imported: str) -> None:
    page = window.chat_page
    _ready(window, qtbot, imported)
    page.max_tokens_spin.setValue(0)  # no limit: only Stop (or the context) ends this answer
    page.temperature_spin.setValue(0.0)
    chunks: list[str] = []
    page.chunk_received.connect(chunks.append)
    page.send("Write a very long story about a dragon who learns to bake bread.")
    qtbot.waitUntil(lambda: len(chunks) >= 3, timeout=SLOW)
    with qtbot.waitSignal(page.answer_finished, timeout=SLOW) as done:
        qtbot.mouseClick(page.stop_button, Qt.MouseButton.LeftButton)
    assert done.args[0] == "cancelled"
    n = len(chunks)
    assert n < 400  # stopped long before the 2048-token context filled up
    assert "stopped" in page.stats_label.text()
    # the partial answer stays in the conversation and nothing arrives afterwards
    assert page.history[-1] == ChatMessage("assistant", "".join(chunks))
    qtbot.wait(300)
    assert len(chunks) == n
    assert page.send_button.isEnabled() and not page.stop_button.isEnabled()


def test_errors_are_shown_inline(window: MainWindow, qtbot: QtBot, imported: str) -> None:
    page = window.chat_page
    _ready(window, qtbot, imported)
    # longer than the 2048-token context the test loads with
    page.send("hello " * 3000)
    with qtbot.waitSignal(page.answer_finished, timeout=SLOW) as done:
        pass
    assert done.args[0] == "error"
    assert "context is 2048 tokens" in page.stats_label.text()
    assert "Error: This model's context is 2048 tokens" in page.transcript.plain_text()
    assert page.history == []  # the failed turn is not part of the conversation
    assert page.send_button.isEnabled()
    # the page still works afterwards
    page.max_tokens_spin.setValue(8)
    with qtbot.waitSignal(page.answer_finished, timeout=SLOW) as done:
        page.send("Say hi.")
    assert done.args[0] in ("stop", "length")
    assert [m.role for m in page.history] == ["user", "assistant"]


def test_sending_without_a_model_says_what_to_do(window: MainWindow, qtbot: QtBot) -> None:
    page = window.chat_page
    qtbot.waitUntil(lambda: page.model_combo.count() == 0 and not page.send_button.isEnabled())
    assert page.send("Hello") is False
    assert "Import a model on the Library page first." in page.transcript.plain_text()
    assert page.history == []


def test_a_thinking_model_shows_its_reasoning_apart_from_the_answer(
    window: MainWindow, qtbot: QtBot, smollm2_path: Path, tmp_path: Path
) -> None:
    """A template that opens <think>: what the model writes is reasoning, streamed dimmed under
    "Thinking", never counted as the answer (nor sent back as history)."""
    from app.core.library.gguf import read_header
    from tests.support.gguf_rewrite import copy_with_template

    template = (
        read_header(smollm2_path).chat_template
        + "{% if add_generation_prompt %}<think>\n{% endif %}"
    )
    thinker = copy_with_template(smollm2_path, tmp_path / "SmolLM2-Think.gguf", template)
    window.library_page.import_files([str(thinker)])
    qtbot.waitUntil(lambda: window.library_page.table_model.rowCount() == 1, timeout=10_000)
    model_id = window.library_page.table_model.ids()[0]
    page = window.chat_page
    page.refresh_models()
    _ready(window, qtbot, model_id)
    page.temperature_spin.setValue(0.0)
    page.max_tokens_spin.setValue(16)
    thoughts: list[str] = []
    page.reasoning_received.connect(thoughts.append)
    statuses: list[str] = []  # the status line as each piece of reasoning arrives
    page.reasoning_received.connect(lambda _t: statuses.append(page.stats_label.text()))
    page.prompt_edit.setPlainText("What is 2+2?")
    with qtbot.waitSignal(page.answer_finished, timeout=SLOW):
        qtbot.mouseClick(page.send_button, Qt.MouseButton.LeftButton)
    reasoning = "".join(thoughts)
    assert reasoning.strip() and page.answer_text == ""
    text = page.transcript.plain_text()
    assert "Thinking" in text and reasoning.strip() in text
    # apart from the answer, collapsed under its toggle, in italics when opened
    view = page.transcript.messages()[-1]
    assert view.thinking_button.text().startswith("Thinking (")
    assert view.reasoning_view.isHidden() and not view.thinking_expanded
    assert view.reasoning_view.toPlainText() == reasoning
    assert view.reasoning_view.font().italic()
    assert view.markdown() == ""
    assert "thinking" in page.stats_label.text()
    assert statuses and all(s == "Thinking…" for s in statuses)  # said while it reasons
    assert all(m.role == "user" or reasoning not in m.content for m in page.history)


def test_after_stop_the_focus_is_back_in_the_message_box(
    window: MainWindow, qtbot: QtBot, imported: str
) -> None:
    from PySide6.QtWidgets import QApplication

    page = window.chat_page
    _ready(window, qtbot, imported)
    window.activateWindow()
    page.max_tokens_spin.setValue(0)
    chunks: list[str] = []
    page.chunk_received.connect(chunks.append)
    page.send("Write a very long story about a dragon who learns to bake bread.")
    qtbot.waitUntil(lambda: len(chunks) >= 3, timeout=SLOW)
    with qtbot.waitSignal(page.answer_finished, timeout=SLOW):
        qtbot.mouseClick(page.stop_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: QApplication.focusWidget() is page.prompt_edit, timeout=5_000)


def test_the_import_a_model_notice_goes_once_a_model_is_imported(
    window: MainWindow, qtbot: QtBot, smollm2_path: Path
) -> None:
    page = window.chat_page
    qtbot.waitUntil(lambda: page.model_combo.count() == 0 and not page.send_button.isEnabled())
    assert page.send("Hello") is False
    assert page.send("Hello") is False  # said once, not once per try
    assert page.transcript.plain_text().count("Import a model on the Library page first.") == 1
    window.library_page.import_files([str(smollm2_path)])
    qtbot.waitUntil(lambda: page.model_combo.count() == 1, timeout=10_000)
    qtbot.waitUntil(lambda: "Import a model" not in page.transcript.plain_text(), timeout=10_000)
    assert page.send_button.isEnabled()


LONG_ERROR = (
    "Error: This model's context is 2048 tokens; the prompt has 3107 tokens and leaves no room "
    "to generate. Shorten the prompt or load the model with a larger context."
)


def test_a_long_status_line_wraps_and_never_widens_the_page(
    window: MainWindow, qtbot: QtBot
) -> None:
    window.show_page("Chat")
    page = window.chat_page
    least = page.minimumSizeHint().width()
    page.stats_label.setText(LONG_ERROR)  # what a failed turn leaves there
    assert page.minimumSizeHint().width() <= least
    scroller = window.stack.currentWidget()
    bar = scroller.horizontalScrollBar()
    qtbot.waitUntil(lambda: not bar.isVisible(), timeout=5_000)  # no sideways scrolling here
    assert page.send_button.geometry().right() < page.width()  # Send is not cut off


def test_at_the_minimum_size_the_page_fits_without_sideways_scrolling(
    window: MainWindow, qtbot: QtBot
) -> None:
    from app.gui.window_state import MINIMUM_SIZE

    window.show_page("Chat")
    page = window.chat_page
    window.resize(MINIMUM_SIZE)
    bar = window.stack.currentWidget().horizontalScrollBar()
    # the settings panel steps aside on a narrow window; the button still opens it
    qtbot.waitUntil(lambda: not bar.isVisible(), timeout=5_000)
    assert not page.options.isVisible() and not page.options_button.isChecked()
    assert page.options_button.geometry().right() <= page.width()
    meter = page.meter
    shown = meter.fontMetrics().horizontalAdvance(meter.text())
    assert shown <= meter.contentsRect().width()  # the meter's text is not cut
    page.options_button.click()  # asked for: it shows, even here
    assert page.options.isVisible()
