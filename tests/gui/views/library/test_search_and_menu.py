"""The Library's search box, Type column, right-click menu, column sizing in a narrow window,
and "Reload with options…" for a loaded model."""

from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QSpinBox
from pytestqt.qtbot import QtBot

from app.gui.bridge import Bridge
from app.gui.context import GuiContext
from app.gui.main_window import MainWindow
from app.gui.models.library import COLUMNS
from app.gui.window_state import MINIMUM_SIZE
from tests.gui.helpers import SLOW

pytestmark = pytest.mark.model

SMOL = "smollm2-135m-instruct.q4_1"
MINILM = "all-minilm-l6-v2-q8_0"


@pytest.fixture
def two_models(
    window: MainWindow, qtbot: QtBot, smollm2_path: Path, embedding_gguf: Path
) -> MainWindow:
    page = window.library_page
    page.import_files([str(smollm2_path), str(embedding_gguf)])
    qtbot.waitUntil(lambda: page.table_model.rowCount() == 2, timeout=10_000)
    window.show_page("Library")
    return window


def type_of(window: MainWindow, model_id: str) -> str:
    m = window.library_page.table_model
    return str(m.index(m.row_of(model_id), COLUMNS.index("Type")).data())


def test_the_type_column_and_the_search_box_filter_rows(two_models: MainWindow) -> None:
    page = two_models.library_page
    assert type_of(two_models, SMOL) == "Chat"
    assert type_of(two_models, MINILM) == "Embedding"
    page.search_edit.setText("minilm")
    assert page.visible_ids() == [MINILM]
    page.search_edit.setText("chat")  # the type is searched too
    assert page.visible_ids() == [SMOL]
    page.search_edit.setText("nothing like this")
    assert page.visible_ids() == []
    page.search_edit.clear()
    assert sorted(page.visible_ids()) == sorted([SMOL, MINILM])


def test_the_context_menu_offers_the_model_actions_and_copies_its_id(
    two_models: MainWindow,
) -> None:
    page = two_models.library_page
    menu = page.context_menu(SMOL)
    enabled = {a.text(): a.isEnabled() for a in menu.actions()}
    assert enabled == {
        "Load…": True,
        "Reload with options…": False,
        "Eject": False,
        "Show in folder": True,
        "Copy model id": True,
        "Remove…": True,
    }
    next(a for a in menu.actions() if a.text() == "Copy model id").trigger()
    assert QGuiApplication.clipboard().text() == SMOL
    assert page.banner.text() == f"Copied {SMOL}."


def test_in_the_narrowest_window_model_type_size_and_state_stay_in_view(
    two_models: MainWindow, qtbot: QtBot
) -> None:
    two_models.resize(MINIMUM_SIZE)
    table = two_models.library_page.table
    qtbot.waitUntil(lambda: two_models.size() == MINIMUM_SIZE, timeout=10_000)
    hh = table.horizontalHeader()

    def in_view(name: str) -> bool:
        col = COLUMNS.index(name)
        left = hh.sectionViewportPosition(col)
        return left >= 0 and left + hh.sectionSize(col) <= table.viewport().width()

    qtbot.waitUntil(lambda: all(in_view(c) for c in ("Model", "Type", "Size", "State")))
    # the header row (title and buttons) fits too: nothing needs a sideways scroll
    page = two_models.library_page
    right = page.remove_button.mapTo(two_models, page.remove_button.rect().topRight()).x()
    assert right < two_models.width()
    assert page.search_edit.width() >= page.search_edit.sizeHint().width()
    # the Model column is wide enough to read an id
    fm = table.fontMetrics()
    assert hh.sectionSize(COLUMNS.index("Model")) >= fm.horizontalAdvance(SMOL)


def test_a_loaded_model_reloads_with_new_options_from_the_library(
    window: MainWindow, qtbot: QtBot, gui_ctx: GuiContext, bridge: Bridge, imported: str
) -> None:
    page = window.library_page
    window.show_page("Library")
    with qtbot.waitSignal(bridge.model_loaded, timeout=SLOW):
        page.load_model(imported)
    loaded = gui_ctx.service.models.loaded()
    assert [(i.model_id, i.context_length) for i in loaded] == [(imported, 2048)]
    qtbot.waitUntil(lambda: page.table_model.state_of(imported) == "loaded", timeout=10_000)
    page.select(imported)
    assert page.load_button.isEnabled()
    assert page.load_button.text() == "Reload…"
    qtbot.mouseClick(page.load_button, Qt.MouseButton.LeftButton)
    dialog = page.load_dialog
    assert dialog is not None
    qtbot.waitUntil(lambda: dialog.load_button.isEnabled(), timeout=10_000)
    assert dialog.reloading and dialog.load_button.text() == "Reload"
    ctx = dialog.option_form.editors["context_length"]
    assert isinstance(ctx, QSpinBox)
    assert ctx.value() == 2048  # prefilled with what it runs with now
    ctx.setValue(4096)
    with qtbot.waitSignal(dialog.load_finished, timeout=SLOW):
        qtbot.mouseClick(dialog.load_button, Qt.MouseButton.LeftButton)
    loaded = gui_ctx.service.models.loaded()
    assert [(i.model_id, i.context_length) for i in loaded] == [(imported, 4096)]
