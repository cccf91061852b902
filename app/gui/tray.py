"""The tray icon: server Start/Stop, Open, Quit; the menu is rebuilt from live state each time."""

from __future__ import annotations

import logging
from collections.abc import Callable

from PySide6.QtCore import QObject, Signal
from PySide6.QtGui import QAction, QIcon
from PySide6.QtWidgets import QMenu, QSystemTrayIcon

log = logging.getLogger(__name__)


class Tray(QObject):
    """Owns the QSystemTrayIcon and its menu. The actions are stable objects; the menu that
    holds them is rebuilt on ``aboutToShow`` so it always matches the server's state."""

    start_requested = Signal()
    stop_requested = Signal()
    open_requested = Signal()
    quit_requested = Signal()
    message_shown = Signal(str, str)  # title, text

    def __init__(
        self,
        icon: QIcon,
        server_url: Callable[[], str | None],
        parent: QObject | None = None,
    ) -> None:
        super().__init__(parent)
        # a callable, not a flag: the menu must reflect the server as it is when it opens
        self._server_url = server_url
        self.menu = QMenu()
        self.status_action = QAction("Server stopped", self)
        self.status_action.setEnabled(False)
        self.start_action = QAction("Start server", self)
        self.stop_action = QAction("Stop server", self)
        self.open_action = QAction("Open Hearth", self)
        self.quit_action = QAction("Quit", self)
        self.start_action.triggered.connect(self.start_requested)
        self.stop_action.triggered.connect(self.stop_requested)
        self.open_action.triggered.connect(self.open_requested)
        self.quit_action.triggered.connect(self.quit_requested)
        self.menu.aboutToShow.connect(self._on_menu_about_to_show)

        self.icon = QSystemTrayIcon(icon, self)
        self.icon.setToolTip("Hearth")
        self.icon.setContextMenu(self.menu)
        self.icon.activated.connect(self._on_icon_activated)
        self.rebuild_menu()

    @staticmethod
    def available() -> bool:
        """Whether the desktop has a tray to hide into (none offscreen or on bare X11)."""
        return QSystemTrayIcon.isSystemTrayAvailable()

    def show(self) -> None:
        if self.available():
            self.icon.show()

    def hide(self) -> None:
        self.icon.hide()

    def rebuild_menu(self) -> None:
        url = self._server_url()
        self.menu.clear()
        self.status_action.setText(f"Server running at {url}" if url else "Server stopped")
        self.start_action.setEnabled(url is None)
        self.stop_action.setEnabled(url is not None)
        self.icon.setToolTip(f"Hearth: serving at {url}" if url else "Hearth")
        for a in (
            self.status_action,
            None,
            self.start_action,
            self.stop_action,
            None,
            self.open_action,
            self.quit_action,
        ):
            if a is None:
                self.menu.addSeparator()
            else:
                self.menu.addAction(a)

    def show_message(self, title: str, text: str) -> None:
        self.icon.showMessage(title, text, QSystemTrayIcon.MessageIcon.Information, 8000)
        self.message_shown.emit(title, text)

    def _on_menu_about_to_show(self) -> None:
        self.rebuild_menu()

    def _on_icon_activated(self, reason: QSystemTrayIcon.ActivationReason) -> None:
        if reason in (
            QSystemTrayIcon.ActivationReason.Trigger,
            QSystemTrayIcon.ActivationReason.DoubleClick,
        ):
            self.open_requested.emit()
