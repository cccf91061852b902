"""The desktop app's entry point: ``run_gui`` (one instance per data folder, the theme before
the first paint, the window, the tray, a clean server stop at exit) and ``show_at_start``.
Tested by tests/gui/test_instance.py and tests/gui/views/library/test_welcome.py."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable

from PySide6.QtWidgets import QApplication

from app.gui.about import app_icon
from app.gui.bridge import Bridge
from app.gui.context import GuiContext
from app.gui.instance import SingleInstance, instance_name
from app.gui.main_window import MainWindow
from app.gui.theme import apply_theme

log = logging.getLogger(__name__)


def show_at_start(
    window: MainWindow, *, background: bool, tray_available: Callable[[], bool] | None = None
) -> bool:
    """Show the window unless ``background`` (``hearth --background``, what start at login
    runs) and a tray exists to reopen it from. Returns whether the window is shown."""
    available = tray_available or window.tray.available
    if background and available():
        log.info("started in the background: Hearth is in the tray")
        return False
    window.show()
    return True


def run_gui(ctx: GuiContext, argv: list[str] | None = None, *, background: bool = False) -> int:
    """Run the desktop app until Quit. Returns the process exit code.

    ``background``: start hidden in the tray where there is one (the window shows otherwise).

    A second launch for the same data folder focuses the first window and returns 0 at once.
    The caller owns ``ctx`` and closes the service and loop afterwards.
    """
    qapp = QApplication.instance()
    if not isinstance(qapp, QApplication):
        qapp = QApplication(argv if argv is not None else sys.argv)
    qapp.setApplicationName("Hearth")
    qapp.setApplicationDisplayName("Hearth")
    qapp.setWindowIcon(app_icon())
    qapp.setQuitOnLastWindowClosed(False)  # the tray keeps us alive while the server runs

    instance = SingleInstance(instance_name(ctx.paths))
    if instance.activate_running():
        return 0
    instance.listen()

    apply_theme(ctx.settings_store.load().ui.theme)  # before the first paint: no flash
    bridge = Bridge(ctx.loop, ctx.service.events)
    window = MainWindow(ctx, bridge)
    instance.activation_requested.connect(window.bring_to_front)
    window.shutdown_finished.connect(qapp.quit)
    show_at_start(window, background=background)
    window.tray.show()
    try:
        return qapp.exec()
    finally:
        instance.close()
        bridge.close()
        if ctx.server.running:  # the session ended without Quit (logout): still stop cleanly
            try:
                ctx.loop.call(ctx.server.stop("exit"), timeout=15)
            except Exception:
                log.exception("stopping the server at exit failed")
