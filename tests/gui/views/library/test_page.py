"""The Library page: import (dialog path and drag-and-drop), metadata, load/unload, remove."""

from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtCore import QMimeData, QPoint, QPointF, Qt, QUrl
from PySide6.QtGui import QDragEnterEvent, QDropEvent
from PySide6.QtWidgets import QApplication, QMessageBox
from pytestqt.qtbot import QtBot

from app.gui.main_window import MainWindow
from app.gui.models.library import COLUMNS
from tests.gui.helpers import SLOW

pytestmark = pytest.mark.model


def cells(window: MainWindow, row: int = 0) -> dict[str, str]:
    m = window.library_page.table_model
    return {name: m.index(row, col).data() for col, name in enumerate(COLUMNS)}


def state_cell(window: MainWindow) -> str:
    return cells(window)["State"]


def test_imported_model_shows_its_metadata(
    window: MainWindow, qtbot: QtBot, smollm2_path: Path
) -> None:
    page = window.library_page
    qtbot.waitUntil(lambda: page.showing_empty_message, timeout=10_000)
    with qtbot.waitSignal(page.model_imported, timeout=10_000) as blocker:
        page.import_files([str(smollm2_path)])
    assert blocker.args[1] is True  # newly added
    qtbot.waitUntil(lambda: page.table_model.rowCount() == 1, timeout=10_000)
    assert cells(window) == {
        "Model": "smollm2-135m-instruct.q4_1",
        "Type": "Chat",
        "Format": "GGUF",
        "Architecture": "llama",
        "Parameters": "135M",
        "Quantization": "Q4_1",
        "Size": "93.8 MiB",
        "Context": "8,192",
        "Chat template": "Yes",
        "Origin": "Imported",
        "State": "Not loaded",
    }
    assert page.table.isVisible()
    assert not page.empty_label.isVisible()
    assert "Imported smollm2-135m-instruct.q4_1" in page.banner.text()
    assert page.selected_id() == "smollm2-135m-instruct.q4_1"  # the new model is selected
    assert page.load_button.isEnabled() and not page.unload_button.isEnabled()

    # importing the same file again is a no-op, and says so
    with qtbot.waitSignal(page.model_imported, timeout=10_000) as blocker:
        page.import_files([str(smollm2_path)])
    assert blocker.args[1] is False
    assert "already in the library" in page.banner.text()
    assert page.table_model.rowCount() == 1


def test_invalid_file_shows_an_inline_error(
    window: MainWindow, qtbot: QtBot, tmp_path: Path
) -> None:
    bad = tmp_path / "notes.gguf"
    bad.write_bytes(b"this is not a gguf file" * 10)
    page = window.library_page
    page.import_files([str(bad)])
    qtbot.waitUntil(lambda: page.banner.kind == "error", timeout=10_000)
    assert page.banner.isVisible()
    assert page.banner.text().startswith("Could not import notes.gguf:")
    assert page.showing_empty_message


def test_a_model_imported_beside_its_projector_shows_vision(
    window: MainWindow, qtbot: QtBot, tmp_path: Path
) -> None:
    from tests.support.fakehub import gguf_bytes
    from tests.support.vision_gguf import write_projector

    folder = tmp_path / "lmstudio"
    folder.mkdir()
    model = folder / "see-Q4_K_M.gguf"
    model.write_bytes(gguf_bytes(tmp_path / "build"))  # embedding size 64
    proj = write_projector(folder / "mmproj-see-F16.gguf", projection_dim=64)
    page = window.library_page
    with qtbot.waitSignal(page.model_imported, timeout=10_000):
        page.import_files([str(model)])
    qtbot.waitUntil(lambda: page.table_model.rowCount() == 1, timeout=10_000)
    assert cells(window)["Type"] == "Chat + vision"
    tip = page.table_model.index(0, 0).data(Qt.ItemDataRole.ToolTipRole)
    assert f"Vision projector: {proj}" in tip


def _mime(*paths: Path) -> QMimeData:
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(p)) for p in paths])
    return mime


# the drag events take a QPoint in PySide6 <= 6.11 and a QPointF since
try:
    QDragEnterEvent(
        QPointF(1, 1),
        Qt.DropAction.CopyAction,
        QMimeData(),
        Qt.MouseButton.LeftButton,
        Qt.KeyboardModifier.NoModifier,
    )
    _POS: QPoint | QPointF = QPointF(50, 50)
except TypeError:
    _POS = QPoint(50, 50)


def test_dropping_a_gguf_on_the_window_imports_it(
    window: MainWindow, qtbot: QtBot, smollm2_path: Path, tmp_path: Path
) -> None:
    window.show_page("Settings")  # a drop anywhere on the window lands on the Library page
    text_file = tmp_path / "readme.txt"
    text_file.write_text("hi")

    # the events do not own their QMimeData: keep each one referenced while in use
    text_only = _mime(text_file)
    enter = QDragEnterEvent(
        _POS,
        Qt.DropAction.CopyAction,
        text_only,
        Qt.MouseButton.LeftButton,
        Qt.KeyboardModifier.NoModifier,
    )
    QApplication.sendEvent(window, enter)
    assert not enter.isAccepted()  # only .gguf files are taken

    mime = _mime(smollm2_path, text_file)
    enter = QDragEnterEvent(
        _POS,
        Qt.DropAction.CopyAction,
        mime,
        Qt.MouseButton.LeftButton,
        Qt.KeyboardModifier.NoModifier,
    )
    QApplication.sendEvent(window, enter)
    assert enter.isAccepted()
    drop = QDropEvent(
        _POS,
        Qt.DropAction.CopyAction,
        mime,
        Qt.MouseButton.LeftButton,
        Qt.KeyboardModifier.NoModifier,
    )
    QApplication.sendEvent(window, drop)
    assert drop.isAccepted()
    assert window.current_page == "Library"
    qtbot.waitUntil(lambda: window.library_page.table_model.rowCount() == 1, timeout=10_000)
    assert cells(window)["Model"] == "smollm2-135m-instruct.q4_1"


def test_load_and_unload_buttons_change_the_state(
    window: MainWindow, qtbot: QtBot, imported: str
) -> None:
    page = window.library_page
    qtbot.waitUntil(lambda: page.selected_id() == imported, timeout=10_000)
    assert state_cell(window) == "Not loaded"

    qtbot.mouseClick(page.load_button, Qt.MouseButton.LeftButton)  # opens the Load dialog
    dialog = page.load_dialog
    assert dialog is not None and dialog.isVisible()
    qtbot.waitUntil(dialog.load_button.isEnabled, timeout=10_000)  # filled in: Load = defaults
    qtbot.mouseClick(dialog.load_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: state_cell(window) == "Loaded", timeout=SLOW)
    qtbot.waitUntil(lambda: page.load_dialog is None, timeout=5_000)  # it closed
    assert page.load_button.text() == "Reload…"  # a loaded model reloads
    assert page.unload_button.isEnabled()
    assert window.chat_page.model_combo.findData(imported) >= 0
    assert "2,048-token context" in page.table_model.index(0, 0).data(Qt.ItemDataRole.ToolTipRole)

    qtbot.mouseClick(page.unload_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: state_cell(window) == "Not loaded", timeout=SLOW)
    assert page.load_button.isEnabled()
    assert not page.unload_button.isEnabled()


def test_remove_asks_then_forgets_the_model(
    window: MainWindow,
    qtbot: QtBot,
    imported: str,
    smollm2_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    page = window.library_page
    qtbot.waitUntil(lambda: page.selected_id() == imported, timeout=10_000)
    asked: list[str] = []

    def answer(_parent: object, _title: str, text: str, *a: object) -> QMessageBox.StandardButton:
        asked.append(text)
        return QMessageBox.StandardButton.No if len(asked) == 1 else QMessageBox.StandardButton.Yes

    monkeypatch.setattr(QMessageBox, "question", answer)
    qtbot.mouseClick(page.remove_button, Qt.MouseButton.LeftButton)  # answered No
    assert page.table_model.rowCount() == 1
    assert "The file stays where it is" in asked[0]  # imported in place: never deleted

    qtbot.mouseClick(page.remove_button, Qt.MouseButton.LeftButton)  # answered Yes
    qtbot.waitUntil(lambda: page.table_model.rowCount() == 0, timeout=10_000)
    assert page.empty_label.isVisible()
    assert f"Removed {imported}." in page.banner.text()
    assert smollm2_path.is_file()


def test_other_apps_models_are_found_shown_and_never_deleted_without_a_yes(
    window: MainWindow,
    qtbot: QtBot,
    smollm2_path: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import dataclasses
    import shutil

    from app.core.library.stores import ForeignLocations

    lms = (
        tmp_path
        / "lmstudio"
        / "models"
        / "lmstudio-community"
        / "SmolLM2-GGUF"
        / "SmolLM2-Q4_1.gguf"
    )
    lms.parent.mkdir(parents=True)
    shutil.copyfile(smollm2_path, lms)
    page = window.library_page
    service = page._service
    service.models._foreign = dataclasses.replace(
        ForeignLocations(), lm_studio=(tmp_path / "lmstudio" / "models",)
    )
    page.scan_button.click()
    qtbot.waitUntil(lambda: page.table_model.rowCount() == 1, timeout=20_000)
    assert cells(window)["Origin"] == "LM Studio"
    # the row can arrive before the scan's answer: the window also follows the index on disk
    qtbot.waitUntil(lambda: "other apps" in page.banner.text(), timeout=20_000)
    page.select(page.table_model.ids()[0])
    # "Remove from Hearth only" keeps LM Studio's file
    monkeypatch.setattr(QMessageBox, "exec", lambda box: box.buttons()[0].click() or 0)
    page.remove_button.click()
    qtbot.waitUntil(lambda: page.table_model.rowCount() == 0, timeout=20_000)
    assert lms.exists(), "another app's file is never deleted without an explicit yes"
