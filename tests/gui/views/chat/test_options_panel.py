"""The Chat page's settings panel: its stop strings and JSON schema reach the real
SmolLM2 request, and its values are kept per model as a preset (in the model's preset)."""

from __future__ import annotations

import json

import pytest
from PySide6.QtCore import Qt
from pytestqt.qtbot import QtBot

from app.gui.context import GuiContext
from app.gui.main_window import MainWindow
from app.gui.views.chat.page import ChatPage
from tests.gui.helpers import SLOW

pytestmark = pytest.mark.model

SCHEMA = {
    "type": "object",
    "properties": {"color": {"enum": ["red", "green", "blue"]}},
    "required": ["color"],
    "additionalProperties": False,
}


def ready(window: MainWindow, qtbot: QtBot, model_id: str) -> ChatPage:
    window.show_page("Chat")
    page = window.chat_page
    qtbot.waitUntil(lambda: page.current_model_id() == model_id, timeout=10_000)
    return page


def answer(page: ChatPage, qtbot: QtBot, text: str) -> str:
    """A fresh chat's answer to ``text``."""
    page.clear()
    with qtbot.waitSignal(page.answer_finished, timeout=SLOW) as done:
        assert page.send(text)
    assert done.args[0] in ("stop", "length")
    return page.answer_text


def test_the_panel_holds_the_settings_and_the_system_prompt(
    window: MainWindow, qtbot: QtBot, imported: str
) -> None:
    page = ready(window, qtbot, imported)
    panel = page.options
    assert page.options_button.isChecked() and panel.isVisible()
    assert panel.system_edit is page.system_edit  # no longer above the transcript
    assert page.system_edit.parent() is not page
    qtbot.mouseClick(page.options_button, Qt.MouseButton.LeftButton)
    assert not panel.isVisible()  # collapsed: the transcript takes the room
    qtbot.mouseClick(page.options_button, Qt.MouseButton.LeftButton)
    assert panel.isVisible()
    panel.top_p_spin.setValue(0.9)
    panel.top_k_spin.setValue(40)
    panel.min_p_spin.setValue(0.05)
    panel.repeat_penalty_spin.setValue(1.1)
    panel.seed_spin.setValue(7)
    s = panel.sampling()
    assert (s.top_p, s.top_k, s.min_p, s.repeat_penalty, s.seed) == pytest.approx(
        (0.9, 40, 0.05, 1.1, 7)
    )
    panel.schema_edit.setPlainText("{not json")
    assert panel.schema_error.isVisible()
    assert page.send("Hello") is False  # not sent with a broken schema
    assert page.history == []


def test_a_json_schema_forces_valid_json_from_the_model(
    window: MainWindow, qtbot: QtBot, imported: str
) -> None:
    page = ready(window, qtbot, imported)
    page.options.max_tokens_spin.setValue(64)
    page.options.temperature_spin.setValue(0.0)
    page.options.schema_edit.setPlainText(json.dumps(SCHEMA))
    out = json.loads(answer(page, qtbot, "What colour is the sky? Answer in JSON."))
    assert set(out) == {"color"} and out["color"] in ("red", "green", "blue")


def test_a_stop_string_cuts_the_answer(window: MainWindow, qtbot: QtBot, imported: str) -> None:
    page = ready(window, qtbot, imported)
    panel = page.options
    panel.max_tokens_spin.setValue(40)
    panel.temperature_spin.setValue(0.0)  # greedy: the same answer each time
    prompt = "Write two sentences about the sea."
    first = answer(page, qtbot, prompt)
    words = first.split()
    assert len(words) > 6
    stop = " " + words[len(words) // 2]
    assert stop in first
    panel.stop_edit.setPlainText(stop)
    cut = answer(page, qtbot, prompt)
    assert cut == first[: first.index(stop)]  # the answer ends before the stop string


def test_a_models_preset_saves_and_loads_the_panel(
    window: MainWindow, qtbot: QtBot, imported: str, gui_ctx: GuiContext
) -> None:
    page = ready(window, qtbot, imported)
    panel = page.options
    panel.system_edit.setPlainText("Be terse.")
    panel.temperature_spin.setValue(0.2)
    panel.stop_edit.setPlainText("END")
    panel.seed_spin.setValue(99)
    qtbot.mouseClick(panel.save_preset_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: "Saved" in panel.preset_label.text(), timeout=10_000)
    # kept in the model's own preset, beside its load options
    saved = gui_ctx.service.models.preset(imported)["chat"]
    assert saved["system_prompt"] == "Be terse." and saved["stop"] == ["END"]
    panel.system_edit.setPlainText("other")
    panel.temperature_spin.setValue(1.3)
    panel.stop_edit.clear()
    panel.seed_spin.setValue(-1)
    with qtbot.waitSignal(panel.preset_loaded, timeout=10_000):
        qtbot.mouseClick(panel.load_preset_button, Qt.MouseButton.LeftButton)
    assert panel.system_edit.toPlainText() == "Be terse."
    assert panel.temperature_spin.value() == pytest.approx(0.2)
    assert panel.stop() == ("END",) and panel.sampling().seed == 99


def test_the_panel_fits_its_narrowest_width_without_sideways_scrolling(
    window: MainWindow, qtbot: QtBot
) -> None:
    from PySide6.QtWidgets import QStyle

    panel = window.chat_page.options
    bar = panel.style().pixelMetric(QStyle.PixelMetric.PM_ScrollBarExtent, None, panel)
    inner = panel.widget()
    # beside a vertical scroll bar, in the panel at its minimum width, every label is readable
    assert inner.minimumSizeHint().width() <= panel.minimumWidth() - bar - 2 * panel.frameWidth()
