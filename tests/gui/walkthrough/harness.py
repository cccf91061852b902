"""The app under the walkthrough: the real window over a real service on the current HEARTH_HOME,
started and quit the way the desktop app does it, plus waiting, grabbing and step checks."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from PySide6.QtGui import QColor, QPainter, QPixmap
from PySide6.QtWidgets import QApplication, QWidget

log = logging.getLogger("walkthrough")


class StepFailed(AssertionError):
    """A step's check did not hold: the walkthrough stops and exits non-zero with this text."""


def check(ok: object, what: str) -> None:
    if not ok:
        raise StepFailed(what)


def wait_until(cond: Callable[[], object], what: str, timeout: float = 120.0) -> None:
    """Process events until ``cond()`` holds; StepFailed naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise StepFailed(f"timed out after {timeout:.0f} s waiting for: {what}")
        QApplication.processEvents()
        time.sleep(0.01)


def settle(seconds: float = 0.3) -> None:
    """Let deferred layout work (column fitting, scrolling, repaints) finish before a grab: only
    pictures wait on this, never a check."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        QApplication.processEvents()
        time.sleep(0.01)


class HearthApp:
    """The real window over a real service (``app.cli.build_service``) on the current
    HEARTH_HOME, wired as ``run_gui`` wires it; ``quit()`` is File › Quit and then what the
    process does at exit (the service and its loop closed)."""

    def __init__(self, *, prepare: Callable[[Any], None] | None = None) -> None:
        from app.cli import build_service
        from app.core.util.loop import LoopThread
        from app.gui.about import app_icon
        from app.gui.bridge import Bridge
        from app.gui.context import GuiContext
        from app.gui.main_window import MainWindow
        from app.gui.theme import apply_theme
        from app.paths import AppPaths
        from app.server.runner import ServerController
        from app.settings import SettingsStore

        qapp = QApplication.instance()
        self.qapp = qapp if isinstance(qapp, QApplication) else QApplication(sys.argv)
        self.qapp.setApplicationName("Hearth")
        self.qapp.setWindowIcon(app_icon())
        self.qapp.setQuitOnLastWindowClosed(False)
        self.paths = AppPaths.default().ensure()
        self.store = SettingsStore(self.paths.settings_file)
        if prepare is not None:
            prepare(self.store)  # settings a user set earlier, before the service reads them
        self.service = build_service(self.paths, self.store.load())
        self.loop = LoopThread().start()
        self.server = ServerController(self.service, self.store, self.paths)
        self.ctx = GuiContext(
            service=self.service,
            loop=self.loop,
            settings_store=self.store,
            paths=self.paths,
            server=self.server,
        )
        apply_theme(self.store.load().ui.theme)  # as run_gui does, before the first paint
        self.bridge = Bridge(self.loop, self.service.events)
        self.window = MainWindow(self.ctx, self.bridge)
        self.window.show()
        self._closed = False
        wait_until(lambda: self.window.settings_page.settings is not None, "the settings read")

    def quit(self) -> None:
        """File › Quit, then the rest of a process exit: nothing of this app is left running."""
        if self._closed:
            return
        w = self.window
        done: list[bool] = []
        w.shutdown_finished.connect(lambda: done.append(True))
        w.quit_app()
        wait_until(lambda: done, "the window to quit (its server stopped)", 60)
        self.close()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        session = self.window.chat_page.session
        box = self.window.settings_page.runtime_box
        if box is not None:  # its report thread imports mlx: let it finish before the loop goes
            wait_until(lambda: not box.checking, "the runtime report", 60)
        self.window.hide()
        self.bridge.close()
        try:
            self.loop.call(self.server.stop("walkthrough"), timeout=30)
            self.loop.call(self.service.close(), timeout=60)
        finally:
            self.loop.stop()
        if session is not None:
            session.store.close()
        self.window.deleteLater()
        QApplication.processEvents()


def grab(widget: QWidget, path: Path) -> Path:
    """Save ``widget`` as it is on screen now (its own rendering: no other window over it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    check(widget.grab().save(str(path)), f"could not write {path}")
    log.info("saved %s", path)
    return path


def with_dialog(window: QPixmap, dialog: QPixmap, path: Path) -> Path:
    """The window with a dialog drawn over its right-hand side, framed and shadowed (a window
    grab leaves out the dialog, a window of its own)."""
    out = QPixmap(window)
    x = max(0, out.width() - dialog.width() - 40)
    y = max(0, min(130, out.height() - dialog.height() - 70))
    p = QPainter(out)
    p.fillRect(x + 6, y + 6, dialog.width(), dialog.height(), QColor(0, 0, 0, 60))  # shadow
    p.drawPixmap(x, y, dialog)
    p.setPen(QColor("#8a8a8a"))
    p.drawRect(x - 1, y - 1, dialog.width() + 1, dialog.height() + 1)
    p.end()
    path.parent.mkdir(parents=True, exist_ok=True)
    check(out.save(str(path)), f"could not write {path}")
    log.info("saved %s", path)
    return path
