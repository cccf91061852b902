"""One settings model: every value on the Settings page waits for Apply (theme and close
behaviour too), the page says when it has unsaved changes and asks before they are lost,
scrolling over it never changes a value, and it fits the window without scrolling sideways."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import QSize, Qt, QTimer
from PySide6.QtGui import QGuiApplication, QPalette, QStandardItemModel
from PySide6.QtWidgets import QApplication, QMessageBox, QScrollArea
from pytestqt.qtbot import QtBot

from app.gui.context import GuiContext
from app.gui.main_window import MainWindow
from app.gui.theme import apply_theme
from app.gui.window_state import DEFAULT_SIZE, MINIMUM_SIZE
from app.settings import Settings
from tests.gui.helpers import show_settings
from tests.gui.views.test_common import wheel


def answer_leave_dialog(window: MainWindow, role: QMessageBox.ButtonRole | None) -> None:
    """Click the unsaved-changes dialog's button with ``role`` (None: Cancel) once it is open."""
    page = window.settings_page

    def click() -> None:
        dialog = page.leave_dialog
        if dialog is None or not dialog.isVisible():
            QTimer.singleShot(20, click)
            return
        for b in dialog.buttons():
            wanted = QMessageBox.ButtonRole.RejectRole if role is None else role
            if dialog.buttonRole(b) == wanted:
                b.click()
                return

    QTimer.singleShot(0, click)


def choose(combo: object, data: str) -> None:
    """Pick an entry as a user does (the combo's ``activated`` follows the pick)."""
    combo.setCurrentIndex(combo.findData(data))  # type: ignore[attr-defined]
    combo.activated.emit(combo.currentIndex())  # type: ignore[attr-defined]


def on_disk(ctx: GuiContext) -> Settings:
    return ctx.settings_store.load()


def test_scrolling_over_the_page_changes_no_value(
    window: MainWindow, qtbot: QtBot, gui_ctx: GuiContext
) -> None:
    page = window.settings_page
    show_settings(window, qtbot)
    window.nav.setFocus()  # the focus is elsewhere: the wheel is meant for the page
    qtbot.waitUntil(window.nav.hasFocus, timeout=5_000)
    spins = (page.budget_spin, page.context_spin, page.threads_spin, page.jit_ttl_spin)
    combos = (page.theme_combo, page.close_action_combo, page.prompt_cache_combo)
    before = [w.value() for w in spins] + [c.currentIndex() for c in combos]
    for w in (*spins, *combos):
        for steps in (-1, -1, 1):
            wheel(w, steps)
    assert [w.value() for w in spins] + [c.currentIndex() for c in combos] == before
    assert not page.unsaved
    assert on_disk(gui_ctx) == Settings()


def test_theme_and_closing_wait_for_apply_and_revert_undoes_them(
    window: MainWindow, qtbot: QtBot, gui_ctx: GuiContext
) -> None:
    page = window.settings_page
    show_settings(window, qtbot)
    assert not page.unsaved_label.isVisible() and not page.revert_button.isEnabled()
    light = QGuiApplication.palette().color(QPalette.ColorRole.Window).lightness()
    try:
        choose(page.theme_combo, "dark")
        choose(page.close_action_combo, "quit")
        page.budget_spin.setValue(2.0)
        assert page.unsaved and page.unsaved_label.isVisible()
        assert page.unsaved_label.text() == "Unsaved changes"
        # nothing is written or applied before Apply
        qtbot.waitUntil(lambda: page.revert_button.isEnabled())
        assert QGuiApplication.palette().color(QPalette.ColorRole.Window).lightness() == light
        assert on_disk(gui_ctx).ui == Settings().ui

        qtbot.mouseClick(page.revert_button, Qt.MouseButton.LeftButton)
        assert page.theme_combo.currentData() == "system"
        assert page.close_action_combo.currentData() == "ask"
        assert page.budget_spin.value() == 0.0 and not page.unsaved_label.isVisible()

        choose(page.theme_combo, "dark")
        choose(page.close_action_combo, "quit")
        with qtbot.waitSignal(page.settings_saved, timeout=10_000):
            qtbot.mouseClick(page.apply_button, Qt.MouseButton.LeftButton)
        assert (on_disk(gui_ctx).ui.theme, on_disk(gui_ctx).ui.close_action) == ("dark", "quit")
        assert QGuiApplication.palette().color(QPalette.ColorRole.Window).lightness() < 80
        assert not page.unsaved and not page.unsaved_label.isVisible()
    finally:
        apply_theme("system")


def test_keeping_serving_in_the_background_is_not_offered_without_a_tray(
    window: MainWindow, qtbot: QtBot
) -> None:
    page = window.settings_page
    show_settings(window, qtbot)
    assert not window.tray.available()  # offscreen: no tray, as on stock GNOME
    combo = page.close_action_combo
    model = combo.model()
    assert isinstance(model, QStandardItemModel)
    assert not model.item(combo.findData("background")).isEnabled()
    assert model.item(combo.findData("quit")).isEnabled()
    assert page.window_box.no_tray_label.isVisible()
    assert "no tray" in page.window_box.no_tray_label.text()


def test_leaving_with_unsaved_changes_asks_apply_discard_or_cancel(
    window: MainWindow, qtbot: QtBot, gui_ctx: GuiContext
) -> None:
    page = window.settings_page
    show_settings(window, qtbot)
    went: list[str] = []
    assert page.ask_leave(lambda: went.append("now"))  # nothing changed: leave, nothing asked
    assert page.leave_dialog is None

    def asked(role: QMessageBox.ButtonRole | None, tag: str) -> None:
        answer_leave_dialog(window, role)
        assert not page.ask_leave(lambda: went.append(tag))  # asked, without blocking
        qtbot.waitUntil(lambda: page.leave_dialog is None, timeout=10_000)

    page.threads_spin.setValue(3)
    asked(None, "cancel")  # Cancel: stay, the change kept
    assert went == [] and page.unsaved and page.threads_spin.value() == 3

    asked(QMessageBox.ButtonRole.DestructiveRole, "discard")
    assert went == ["discard"] and not page.unsaved and page.threads_spin.value() == 0
    assert on_disk(gui_ctx).load.threads == 0

    page.threads_spin.setValue(5)
    asked(QMessageBox.ButtonRole.AcceptRole, "apply")  # left once it is written
    qtbot.waitUntil(lambda: went[-1] == "apply", timeout=10_000)
    assert on_disk(gui_ctx).load.threads == 5 and not page.unsaved


def test_the_window_asks_before_unsaved_settings_are_left_or_closed(
    window: MainWindow, qtbot: QtBot, gui_ctx: GuiContext
) -> None:
    page = window.settings_page
    show_settings(window, qtbot)
    settings_row = window.pages.index(page)

    def answered() -> None:
        qtbot.waitUntil(lambda: page.leave_dialog is None, timeout=10_000)

    page.threads_spin.setValue(3)
    answer_leave_dialog(window, None)  # Cancel: the sidebar stays on Settings
    window.show_page("Library")
    answered()
    assert window.current_page == "Settings" and window.nav.currentRow() == settings_row
    assert page.unsaved and page.threads_spin.value() == 3

    answer_leave_dialog(window, None)  # Cancel: the window stays open
    window.close()
    answered()
    assert window.isVisible() and page.unsaved

    answer_leave_dialog(window, QMessageBox.ButtonRole.AcceptRole)  # Apply: written, then gone
    window.show_page("Library")
    qtbot.waitUntil(lambda: window.current_page == "Library", timeout=10_000)
    assert on_disk(gui_ctx).load.threads == 3 and not page.unsaved

    show_settings(window, qtbot)
    page.threads_spin.setValue(4)
    answer_leave_dialog(window, QMessageBox.ButtonRole.DestructiveRole)  # Discard: go
    window.show_page("Library")
    qtbot.waitUntil(lambda: window.current_page == "Library", timeout=10_000)
    assert not page.unsaved and on_disk(gui_ctx).load.threads == 3


def test_a_value_changed_elsewhere_shows_without_losing_an_edit(
    window: MainWindow, qtbot: QtBot, gui_ctx: GuiContext
) -> None:
    page = window.settings_page
    show_settings(window, qtbot)
    page.threads_spin.setValue(4)  # being edited
    gui_ctx.settings_store.update_ui(close_action="quit")  # the close dialog, or the welcome
    page.reload()  # what showing the page again does
    qtbot.waitUntil(lambda: page.close_action_combo.currentData() == "quit", timeout=10_000)
    assert page.threads_spin.value() == 4 and page.unsaved


def no_side_scroll(window: MainWindow, qtbot: QtBot, size: QSize) -> Callable[[], bool]:
    window.resize(size)
    scroller = window.stack.currentWidget()
    assert isinstance(scroller, QScrollArea)
    QApplication.processEvents()
    return lambda: not scroller.horizontalScrollBar().isVisible()


def test_the_page_fits_the_window_width_at_the_default_and_minimum_sizes(
    window: MainWindow, qtbot: QtBot
) -> None:
    show_settings(window, qtbot)
    window.showNormal()
    for size in (DEFAULT_SIZE, MINIMUM_SIZE):
        fits = no_side_scroll(window, qtbot, size)
        qtbot.waitUntil(lambda s=size: window.size() == s, timeout=5_000)
        qtbot.waitUntil(fits, timeout=5_000)
        page = window.settings_page
        assert page.width() <= window.stack.currentWidget().viewport().width()  # type: ignore[attr-defined]


def test_a_close_choice_made_in_the_close_dialog_shows_as_saved(
    window: MainWindow, qtbot: QtBot
) -> None:
    page = window.settings_page
    show_settings(window, qtbot)
    page.show_saved_ui(close_action="quit")  # what "Don't ask again" hands the page
    assert page.close_action_combo.currentData() == "quit" and not page.unsaved
