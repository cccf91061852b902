"""Help > About Hearth (F1, or Alt+H then A): the version, the license, the docs and the data,
models and logs folders."""

from __future__ import annotations

from PySide6.QtCore import Qt, QUrl
from PySide6.QtWidgets import QMenu
from pytestqt.qtbot import QtBot

from app import __version__
from app.gui.about import AboutDialog
from app.gui.context import GuiContext
from app.gui.main_window import MainWindow


def about_dialogs(window: MainWindow) -> list[AboutDialog]:
    return [d for d in window.findChildren(AboutDialog) if d.isVisible()]


def test_f1_opens_about_with_version_license_and_folders(
    window: MainWindow, qtbot: QtBot, gui_ctx: GuiContext
) -> None:
    menus = {a.text(): a.menu() for a in window.menuBar().actions()}
    assert "&Help" in menus  # Alt+H opens it
    help_menu = menus["&Help"]
    assert isinstance(help_menu, QMenu)
    assert [a.text() for a in help_menu.actions()] == ["&About Hearth"]

    window.activateWindow()
    qtbot.keyClick(window, Qt.Key.Key_F1)
    qtbot.waitUntil(lambda: len(about_dialogs(window)) == 1, timeout=10_000)
    dialog = about_dialogs(window)[0]
    text = dialog.text.text()
    assert f"Hearth {__version__}" in text
    assert "License: MIT" in text
    for folder in (gui_ctx.paths.data, gui_ctx.paths.models, gui_ctx.paths.logs):
        assert QUrl.fromLocalFile(str(folder)).toString() in text
    # links are reachable from the keyboard
    assert dialog.text.textInteractionFlags() & Qt.TextInteractionFlag.LinksAccessibleByKeyboard
    dialog.reject()
    qtbot.waitUntil(lambda: not about_dialogs(window), timeout=10_000)
