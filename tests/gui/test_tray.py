"""Tray actions (triggered directly: offscreen has no tray host) and close-to-tray."""

from __future__ import annotations

import pytest
from pytestqt.qtbot import QtBot

from app.gui.context import GuiContext
from app.gui.main_window import MainWindow
from app.gui.tray import Tray
from tests.gui.helpers import SLOW


def open_menu(window: MainWindow) -> list[str]:
    """What the user sees when the tray menu opens (it is rebuilt on aboutToShow)."""
    window.tray.menu.aboutToShow.emit()
    return [a.text() for a in window.tray.menu.actions() if not a.isSeparator()]


def start_via_tray(window: MainWindow, qtbot: QtBot) -> None:
    window.server_page.port_spin.setValue(0)
    assert window.tray.start_action.isEnabled()
    window.tray.start_action.trigger()
    qtbot.waitUntil(
        lambda: window.server_page.status_label.text().startswith("Running at"), timeout=SLOW
    )


def test_start_and_stop_actions(window: MainWindow, qtbot: QtBot, gui_ctx: GuiContext) -> None:
    tray = window.tray
    assert open_menu(window) == [
        "Server stopped",
        "Start server",
        "Stop server",
        "No models loaded",
        "Open Hearth",
        "Quit",
    ]
    assert tray.start_action.isEnabled() and not tray.stop_action.isEnabled()

    start_via_tray(window, qtbot)
    assert gui_ctx.server.running
    url = gui_ctx.server.base_url
    assert open_menu(window)[0] == f"Server running at {url}"
    assert not tray.start_action.isEnabled() and tray.stop_action.isEnabled()

    tray.stop_action.trigger()
    qtbot.waitUntil(lambda: not gui_ctx.server.running, timeout=SLOW)
    assert open_menu(window)[0] == "Server stopped"
    assert tray.start_action.isEnabled() and not tray.stop_action.isEnabled()


def test_stop_right_after_start_is_honoured(
    window: MainWindow, qtbot: QtBot, gui_ctx: GuiContext
) -> None:
    # Stop asked for while the server is still starting (the tray enables Stop as soon as the
    # server reports its address): it stops once it has started
    page = window.server_page
    page.port_spin.setValue(0)
    page.start_server()
    page.stop_server()
    qtbot.waitUntil(lambda: window.server_page.status_label.text() == "Stopped", timeout=SLOW)
    assert not gui_ctx.server.running


def test_menu_reflects_a_server_started_elsewhere(
    window: MainWindow, qtbot: QtBot, gui_ctx: GuiContext
) -> None:
    # started behind the GUI's back (say, by a script): the menu is built from live state
    gui_ctx.loop.call(gui_ctx.server.start("127.0.0.1", 0), timeout=30)
    assert open_menu(window)[0] == f"Server running at {gui_ctx.server.base_url}"
    assert window.tray.stop_action.isEnabled()


def test_open_action_shows_the_window(window: MainWindow, qtbot: QtBot) -> None:
    window.hide()
    assert not window.isVisible()
    window.tray.open_action.trigger()
    assert window.isVisible()
    window.showMinimized()
    window.tray.open_action.trigger()
    assert not window.isMinimized()


def test_quit_action_stops_the_server_then_finishes(
    window: MainWindow, qtbot: QtBot, gui_ctx: GuiContext
) -> None:
    start_via_tray(window, qtbot)
    with qtbot.waitSignal(window.shutdown_finished, timeout=SLOW):
        window.tray.quit_action.trigger()
    assert not gui_ctx.server.running
    assert not window.isVisible()


def test_close_with_the_server_running_hides_to_the_tray_and_says_so_once(
    window: MainWindow, qtbot: QtBot, gui_ctx: GuiContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(Tray, "available", staticmethod(lambda: True))  # a desktop with a tray
    start_via_tray(window, qtbot)
    messages: list[tuple[str, str]] = []
    window.tray.message_shown.connect(lambda title, text: messages.append((title, text)))
    finished: list[bool] = []
    window.shutdown_finished.connect(lambda: finished.append(True))

    with qtbot.waitSignal(window.hidden_to_tray, timeout=5_000):
        window.close()
    assert not window.isVisible()
    assert gui_ctx.server.running
    qtbot.waitUntil(lambda: len(messages) == 1, timeout=10_000)
    assert gui_ctx.server.base_url in messages[0][1]
    assert gui_ctx.settings_store.load().tray_hint_shown

    window.tray.open_action.trigger()
    assert window.isVisible()
    window.close()
    qtbot.wait(300)
    assert not window.isVisible() and gui_ctx.server.running
    assert len(messages) == 1  # only the first time
    assert finished == []


def test_close_without_a_tray_asks_and_keeps_serving(
    window: MainWindow, qtbot: QtBot, gui_ctx: GuiContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(Tray, "available", staticmethod(lambda: False))
    start_via_tray(window, qtbot)
    window.close()  # no tray to hide into: ask (tests/gui/test_window_product.py for the rest)
    assert window.isVisible() and window.close_dialog is not None
    assert gui_ctx.server.running
    window.close_dialog.cancel_button.click()


def test_close_with_the_server_stopped_quits(
    window: MainWindow, qtbot: QtBot, gui_ctx: GuiContext
) -> None:
    with qtbot.waitSignal(window.shutdown_finished, timeout=5_000):
        window.close()
    assert not window.isVisible()
    assert not gui_ctx.settings_store.load().tray_hint_shown
