"""The main window renders every page, and the library's first-time message."""

from __future__ import annotations

from PySide6.QtWidgets import QWidget
from pytestqt.qtbot import QtBot

from app.gui.main_window import PAGES, MainWindow
from app.gui.units import human_bytes


def test_navigation_shows_each_page(window: MainWindow, qtbot: QtBot) -> None:
    assert [window.nav.item(i).text() for i in range(window.nav.count())] == list(PAGES)
    pages = {
        "Library": window.library_page,
        "Discover": window.discover_page,
        "Downloads": window.downloads_page,
        "Models in memory": window.memory_page,
        "Chat": window.chat_page,
        "Server": window.server_page,
        "Providers": window.providers_page,
        "Settings": window.settings_page,
    }
    for name, page in pages.items():
        window.nav.setCurrentRow(PAGES.index(name))
        assert window.current_page == name
        assert page.isVisible()
        assert all(not other.isVisible() for other in pages.values() if other is not page)
    assert window.windowTitle() == "Hearth"
    assert not window.windowIcon().isNull()


def test_memory_page_starts_empty_and_the_status_bar_links_to_it(
    window: MainWindow, qtbot: QtBot
) -> None:
    page = window.memory_page
    qtbot.waitUntil(lambda: window.memory.fetched, timeout=10_000)
    window.show_page("Models in memory")
    assert page.empty_label.isVisible() and "No models loaded" in page.empty_label.text()
    assert not page.unload_button.isEnabled() and not page.pin_button.isEnabled()
    budget = window.memory.snapshot.budget
    assert budget > 0
    assert page.memory_label.text() == f"0 B of {human_bytes(budget)} budget in use (0%)"
    assert window.memory_status.text() == (
        f"<a href='memory'>No models in memory</a> · 0 B of {human_bytes(budget)}"
    )
    window.show_page("Library")
    window.memory_status.linkActivated.emit("memory")
    assert window.current_page == "Models in memory"


def test_empty_library_shows_how_to_get_a_model(window: MainWindow, qtbot: QtBot) -> None:
    page = window.library_page
    qtbot.waitUntil(lambda: page.empty_label.isVisible(), timeout=10_000)
    assert page.showing_empty_message
    assert not page.table.isVisible()
    text = page.empty_label.text()
    assert "hearth import PATH" in text
    assert ".gguf" in text
    assert page.empty_import_button.isVisible()


def test_server_page_starts_stopped(window: MainWindow) -> None:
    window.show_page("Server")
    page = window.server_page
    assert page.status_label.text() == "Stopped"
    assert page.start_button.isEnabled()
    assert not page.stop_button.isEnabled()
    assert page.url_edit.text() == ""
    assert window.server_status.text() == "Server: stopped"


def test_every_control_on_every_page_is_reachable_with_the_keyboard(
    window: MainWindow, qtbot: QtBot
) -> None:
    from PySide6.QtCore import Qt
    from PySide6.QtWidgets import (
        QAbstractButton,
        QAbstractSpinBox,
        QComboBox,
        QLineEdit,
        QPlainTextEdit,
        QSlider,
        QTextEdit,
    )

    kinds = (QAbstractButton, QAbstractSpinBox, QComboBox, QLineEdit, QPlainTextEdit,
             QTextEdit, QSlider)  # fmt: skip
    unreachable = []
    for name in PAGES:
        window.show_page(name)
        page = window.pages[PAGES.index(name)]
        for w in page.findChildren(QWidget):
            if not isinstance(w, kinds) or not w.isVisibleTo(page) or not w.isEnabled():
                continue
            if not (w.focusPolicy() & Qt.FocusPolicy.TabFocus):
                unreachable.append(f"{name}: {type(w).__name__} {w.objectName() or w.toolTip()!r}")
    assert not unreachable, unreachable
