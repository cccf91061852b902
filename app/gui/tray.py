"""The tray icon: server Start/Stop, the loaded models (each with Unload), the unfinished
downloads (each with Pause/Resume and Cancel), Open, Quit; the menu is rebuilt from live state
each time it opens."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from PySide6.QtCore import QObject, Signal
from PySide6.QtGui import QAction, QIcon
from PySide6.QtWidgets import QMenu, QSystemTrayIcon

from app.core.engine.scheduler import LoadedInfo
from app.core.hub.downloads import DownloadStatus
from app.gui.models.download import STATE_TEXT, percent
from app.gui.units import human_bytes

log = logging.getLogger(__name__)


def _no_models() -> Sequence[LoadedInfo]:
    return ()


def _no_downloads() -> Sequence[DownloadStatus]:
    return ()


def download_label(s: DownloadStatus) -> str:
    """``"tiny-Q4_K_M.gguf — 42% (Downloading)"``."""
    return f"{s.name} — {percent(s)}% ({STATE_TEXT.get(s.state, s.state)})"


class Tray(QObject):
    """Owns the QSystemTrayIcon and its menu. The actions are stable objects; the menu that
    holds them is rebuilt on ``aboutToShow`` so it always matches the server's state and the
    loaded models (one submenu each, with Unload)."""

    start_requested = Signal()
    stop_requested = Signal()
    open_requested = Signal()
    quit_requested = Signal()
    unload_requested = Signal(str)  # model id
    download_action_requested = Signal(str, str)  # "pause" | "resume" | "cancel", download id
    downloads_requested = Signal()  # show the Downloads page
    menu_opened = Signal()  # about to show: a chance to refresh the loaded models
    message_shown = Signal(str, str)  # title, text

    def __init__(
        self,
        icon: QIcon,
        server_url: Callable[[], str | None],
        parent: QObject | None = None,
        *,
        loaded_models: Callable[[], Sequence[LoadedInfo]] = _no_models,
        active_downloads: Callable[[], Sequence[DownloadStatus]] = _no_downloads,
    ) -> None:
        super().__init__(parent)
        # callables, not flags: the menu must reflect the state as it is when it opens
        self._server_url = server_url
        self._loaded_models = loaded_models
        self._active_downloads = active_downloads
        self.download_menus: list[QMenu] = []  # one submenu per unfinished download
        self._shown_downloads: list[tuple[str, str, int]] = []
        self.model_menus: list[QMenu] = []  # one submenu per loaded model, rebuilt each time
        self._shown_models: list[tuple[str, int, bool]] = []
        self.menu = QMenu()
        self.status_action = QAction("Server stopped", self)
        self.status_action.setEnabled(False)
        self.start_action = QAction("Start server", self)
        self.stop_action = QAction("Stop server", self)
        self.models_header_action = QAction("No models loaded", self)
        self.models_header_action.setEnabled(False)
        self.downloads_header_action = QAction("Downloads", self)
        self.downloads_header_action.triggered.connect(self.downloads_requested)
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
        for a in (self.status_action, None, self.start_action, self.stop_action, None):
            if a is None:
                self.menu.addSeparator()
            else:
                self.menu.addAction(a)
        self._add_model_entries()
        self._add_download_entries()
        self.menu.addSeparator()
        self.menu.addAction(self.open_action)
        self.menu.addAction(self.quit_action)

    def models_changed(self) -> None:
        """The loaded models may have changed: rebuild an open menu if what it lists is stale
        (a closed menu rebuilds itself when it opens)."""
        if self.menu.isVisible() and _menu_key(self._loaded_models()) != self._shown_models:
            self.rebuild_menu()

    def downloads_changed(self) -> None:
        """Downloads progressed: rebuild an open menu if what it lists is stale."""
        if self.menu.isVisible() and _download_key(self._active_downloads()) != (
            self._shown_downloads
        ):
            self.rebuild_menu()

    def _add_download_entries(self) -> None:
        for m in self.download_menus:
            m.deleteLater()
        self.download_menus = []
        downloads = list(self._active_downloads())
        self._shown_downloads = _download_key(downloads)
        if not downloads:
            return
        self.menu.addSeparator()
        n = len(downloads)
        self.downloads_header_action.setText(f"Downloads ({n})")
        self.menu.addAction(self.downloads_header_action)
        for s in downloads:
            sub = QMenu(download_label(s), self.menu)
            if s.state == "paused":
                act = sub.addAction("Resume")
                kind = "resume"
            else:
                act = sub.addAction("Pause")
                kind = "pause"
            act.triggered.connect(
                lambda _c=False, k=kind, d=s.id: self.download_action_requested.emit(k, d)
            )
            cancel = sub.addAction("Cancel")
            cancel.triggered.connect(
                lambda _c=False, d=s.id: self.download_action_requested.emit("cancel", d)
            )
            self.menu.addMenu(sub)
            self.download_menus.append(sub)

    def _add_model_entries(self) -> None:
        for m in self.model_menus:
            m.deleteLater()
        self.model_menus = []
        models = list(self._loaded_models())
        self._shown_models = _menu_key(models)
        self.models_header_action.setText("Loaded models" if models else "No models loaded")
        self.menu.addAction(self.models_header_action)
        for info in models:
            note = human_bytes(info.memory_bytes) + (", pinned" if info.pinned else "")
            sub = QMenu(f"{info.model_id}  ({note})", self.menu)
            unload = sub.addAction("Unload")
            unload.triggered.connect(
                lambda _checked=False, mid=info.model_id: self.unload_requested.emit(mid)
            )
            self.menu.addMenu(sub)
            self.model_menus.append(sub)

    def show_message(self, title: str, text: str) -> None:
        self.icon.showMessage(title, text, QSystemTrayIcon.MessageIcon.Information, 8000)
        self.message_shown.emit(title, text)

    def _on_menu_about_to_show(self) -> None:
        self.rebuild_menu()
        self.menu_opened.emit()

    def _on_icon_activated(self, reason: QSystemTrayIcon.ActivationReason) -> None:
        if reason in (
            QSystemTrayIcon.ActivationReason.Trigger,
            QSystemTrayIcon.ActivationReason.DoubleClick,
        ):
            self.open_requested.emit()


def _download_key(downloads: Sequence[DownloadStatus]) -> list[tuple[str, str, int]]:
    return [(s.id, s.state, percent(s)) for s in downloads]


def _menu_key(models: Sequence[LoadedInfo]) -> list[tuple[str, int, bool]]:
    return [(m.model_id, m.memory_bytes, m.pinned) for m in models]
