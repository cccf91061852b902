"""Single instance: a second launch for the same data folder focuses the first window."""

from __future__ import annotations

import socket
from pathlib import Path

from PySide6.QtCore import QTimer
from PySide6.QtNetwork import QLocalServer
from PySide6.QtWidgets import QApplication
from pytestqt.qtbot import QtBot

from app.gui.context import GuiContext
from app.gui.instance import SingleInstance, instance_name
from app.gui.launch import run_gui
from app.gui.main_window import MainWindow
from app.paths import AppPaths


def test_names_follow_the_data_folder(tmp_path: Path) -> None:
    a = AppPaths.default(tmp_path / "a")
    assert instance_name(a) == instance_name(AppPaths.default(tmp_path / "a"))
    assert instance_name(a) != instance_name(AppPaths.default(tmp_path / "b"))


def test_second_instance_activates_the_first(qtbot: QtBot, tmp_path: Path) -> None:
    name = instance_name(AppPaths.default(tmp_path))
    first = SingleInstance(name)
    assert first.listen()
    try:
        with qtbot.waitSignal(first.activation_requested, timeout=10_000):
            assert SingleInstance(name).activate_running()
        # a different data folder is a different app: nobody answers
        other = instance_name(AppPaths.default(tmp_path / "elsewhere"))
        assert not SingleInstance(other).activate_running(timeout_ms=300)
    finally:
        first.close()
    assert not SingleInstance(name).activate_running(timeout_ms=300)


def test_a_stale_socket_from_a_crash_is_taken_over(qtbot: QtBot, tmp_path: Path) -> None:
    name = instance_name(AppPaths.default(tmp_path))
    probe = QLocalServer()
    assert probe.listen(name)
    path = probe.fullServerName()
    probe.close()
    # what a crashed process leaves behind: a socket file nobody accepts on
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(path)
    dead.close()
    assert Path(path).exists()
    assert not SingleInstance(name).activate_running(timeout_ms=300)
    first = SingleInstance(name)
    try:
        assert first.listen()
        with qtbot.waitSignal(first.activation_requested, timeout=10_000):
            assert SingleInstance(name).activate_running()
    finally:
        first.close()


def test_run_gui_hands_over_to_a_running_instance(qtbot: QtBot, gui_ctx: GuiContext) -> None:
    first = SingleInstance(instance_name(gui_ctx.paths))
    assert first.listen()
    try:
        with qtbot.waitSignal(first.activation_requested, timeout=10_000):
            assert run_gui(gui_ctx) == 0  # returns at once, without a window
        assert not [w for w in QApplication.topLevelWidgets() if isinstance(w, MainWindow)]
    finally:
        first.close()


def test_run_gui_shows_the_window_comes_forward_on_a_second_launch_and_quits(
    qtbot: QtBot, gui_ctx: GuiContext
) -> None:
    seen: dict[str, object] = {}
    app = QApplication.instance()
    assert app is not None
    safety = QTimer()
    safety.setSingleShot(True)
    safety.timeout.connect(app.quit)  # never hang the suite if Quit breaks
    safety.start(60_000)

    def window() -> MainWindow:
        return next(w for w in QApplication.topLevelWidgets() if isinstance(w, MainWindow))

    def step1() -> None:
        w = window()
        seen["visible"] = w.isVisible()
        w.showMinimized()
        seen["second_launch"] = SingleInstance(instance_name(gui_ctx.paths)).activate_running()
        QTimer.singleShot(500, step2)

    def step2() -> None:
        w = window()
        seen["minimized_after_activation"] = w.isMinimized()
        w.tray.quit_action.trigger()

    QTimer.singleShot(300, step1)
    rc = run_gui(gui_ctx)
    safety.stop()
    assert rc == 0
    assert seen == {"visible": True, "second_launch": True, "minimized_after_activation": False}
    # the instance socket is released on exit: a new launch would become the first again
    assert not SingleInstance(instance_name(gui_ctx.paths)).activate_running(timeout_ms=300)
    for w in QApplication.topLevelWidgets():
        if isinstance(w, MainWindow):
            w.deleteLater()
