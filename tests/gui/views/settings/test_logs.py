"""Settings › Logs: recording request and answer text is a switch (applied with the page) with
its privacy warning beside it, and "Open logs folder" opens the folder the log file is in."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QPoint, Qt
from PySide6.QtGui import QDesktopServices
from pytestqt.qtbot import QtBot

from app.gui.context import GuiContext
from app.gui.main_window import MainWindow
from tests.gui.helpers import show_settings
from tests.gui.views.settings.test_as_found import UrlCatcher


def test_recording_request_text_is_a_switch_with_its_privacy_warning(
    window: MainWindow, qtbot: QtBot, gui_ctx: GuiContext
) -> None:
    page = window.settings_page
    show_settings(window, qtbot)
    box = page.logs_box
    check = page.record_content_check
    assert check.isVisible() and not check.isChecked()  # off by default
    warning = box.privacy_label.text()
    assert box.privacy_label.isVisible()
    assert "text of each request" in warning and "answer" in warning  # what
    assert str(gui_ctx.paths.requests_db) in warning  # where
    assert "Anyone who can read your files" in warning  # who

    qtbot.mouseClick(check, Qt.MouseButton.LeftButton, pos=QPoint(8, check.height() // 2))
    assert page.unsaved and gui_ctx.settings_store.load().records.log_content is False
    with qtbot.waitSignal(page.settings_saved, timeout=10_000):
        qtbot.mouseClick(page.apply_button, Qt.MouseButton.LeftButton)
    assert gui_ctx.settings_store.load().records.log_content is True


def test_open_logs_folder_opens_the_folder_of_the_log_file(
    window: MainWindow, qtbot: QtBot, gui_ctx: GuiContext
) -> None:
    page = window.settings_page
    show_settings(window, qtbot)
    box = page.logs_box
    assert "hearth.log" in box.file_label.text()
    catcher = UrlCatcher()
    QDesktopServices.setUrlHandler("file", catcher, "open")
    try:
        qtbot.mouseClick(box.open_button, Qt.MouseButton.LeftButton)
        qtbot.waitUntil(lambda: bool(catcher.urls), timeout=10_000)
    finally:
        QDesktopServices.unsetUrlHandler("file")
    opened = Path(catcher.urls[0].toLocalFile())
    assert opened.resolve() == gui_ctx.paths.logs.resolve() and opened.is_dir()
