"""The Chat page's picker, context meter and stats line, over the real service: chat models
only (never an embedding model), the last choice kept across a restart, vision marked, the
context's fill after each turn and the first token's time under each answer."""

from __future__ import annotations

from pathlib import Path

import pytest
from pytestqt.qtbot import QtBot

from app.gui.bridge import Bridge
from app.gui.context import GuiContext
from app.gui.main_window import MainWindow
from app.gui.views.chat.page import ChatPage
from app.gui.views.chat.parts import ChatModel
from tests.gui.helpers import SLOW
from tests.support.gguf_files import write_model

pytestmark = pytest.mark.model


def ids_listed(page: ChatPage) -> list[str]:
    return [page.model_combo.itemData(i) for i in range(page.model_combo.count())]


def test_the_picker_offers_chat_models_only_and_remembers_the_last_choice(
    window: MainWindow,
    qtbot: QtBot,
    embedding_gguf: Path,
    smollm2_path: Path,
    tmp_path: Path,
    gui_ctx: GuiContext,
    bridge: Bridge,
) -> None:
    library = window.library_page
    tiny = write_model(tmp_path / "Aaa-Tiny-Q8_0.gguf")  # listed before SmolLM2
    library.import_files([str(embedding_gguf), str(tiny), str(smollm2_path)])
    qtbot.waitUntil(lambda: library.table_model.rowCount() == 3, timeout=30_000)
    page = window.chat_page
    qtbot.waitUntil(lambda: page.model_combo.count() == 2, timeout=10_000)
    listed = ids_listed(page)
    assert not any("minilm" in m.lower() for m in listed)  # an embedding model cannot chat
    smol = next(m for m in listed if "smollm2" in m.lower())
    assert page.current_model_id() != smol
    i = page.model_combo.findData(smol)
    page.model_combo.setCurrentIndex(i)
    page.model_combo.activated.emit(i)  # what a pick in the drop-down sends
    qtbot.waitUntil(lambda: gui_ctx.settings_store.load().chat.last_model == smol, timeout=10_000)

    # the app starts again: the picker comes back on the model picked last
    again = ChatPage(gui_ctx.service, bridge, settings=gui_ctx.settings_store)
    qtbot.addWidget(again)
    qtbot.waitUntil(lambda: again.model_combo.count() == 2, timeout=10_000)
    assert again.current_model_id() == smol


def test_a_vision_model_is_marked_in_the_picker() -> None:
    assert "vision" in ChatModel("qwen-vl", False, vision=True).label
    assert "vision" not in ChatModel("smol", False).label


def test_the_context_meter_and_the_first_token_time_follow_each_turn(
    window: MainWindow, qtbot: QtBot, imported: str
) -> None:
    window.show_page("Chat")
    page = window.chat_page
    qtbot.waitUntil(lambda: page.current_model_id() == imported, timeout=10_000)
    page.max_tokens_spin.setValue(16)
    assert page.meter.used == 0
    with qtbot.waitSignal(page.answer_finished, timeout=SLOW):
        page.send("Name a colour.")
    qtbot.waitUntil(lambda: page.meter.total == 2048, timeout=10_000)  # the loaded context
    first = page.meter.used
    assert 0 < first < 2048 and "/ 2,048" in page.meter.text()
    answer = page.transcript.last_message()
    assert answer is not None
    assert "first token" in answer.notice and "tok/s" in answer.notice
    with qtbot.waitSignal(page.answer_finished, timeout=SLOW):
        page.send("And another one.")
    qtbot.waitUntil(lambda: page.meter.used > first, timeout=10_000)  # the context fills up
    page.clear()
    assert page.meter.used == 0
