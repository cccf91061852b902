"""The main window (navigation + pages) and ``run_gui``, the desktop app's entry point."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QSize, Qt, Signal
from PySide6.QtGui import QCloseEvent, QDragEnterEvent, QDragMoveEvent, QDropEvent, QIcon
from PySide6.QtWidgets import (
    QApplication,
    QHBoxLayout,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QMainWindow,
    QStackedWidget,
    QWidget,
)

import app as app_package
from app.core.autostart import Autostart
from app.gui.bridge import Bridge, error_text
from app.gui.context import GuiContext
from app.gui.instance import SingleInstance, instance_name
from app.gui.models.memory import MemoryMonitor, MemorySnapshot
from app.gui.tray import Tray
from app.gui.units import human_bytes
from app.gui.views.chat import ChatPage
from app.gui.views.discover import TITLE as DISCOVER_PAGE
from app.gui.views.discover import DiscoverPage
from app.gui.views.downloads import TITLE as DOWNLOADS_PAGE
from app.gui.views.downloads import DownloadsPage
from app.gui.views.library import LibraryPage, gguf_paths
from app.gui.views.memory import TITLE as MEMORY_PAGE
from app.gui.views.memory import MemoryPage
from app.gui.views.providers import TITLE as PROVIDERS_PAGE
from app.gui.views.providers import ProvidersPage
from app.gui.views.runtime_info import report_source
from app.gui.views.server import ServerPage
from app.gui.views.settings import SettingsPage
from app.gui.views.welcome import WelcomeView
from app.server.runner import base_url
from app.settings import Settings, TokenStore

log = logging.getLogger(__name__)

ASSETS = Path(app_package.__file__).resolve().parent / "assets"
PAGES = (
    "Library",
    DISCOVER_PAGE,
    DOWNLOADS_PAGE,
    MEMORY_PAGE,
    "Chat",
    "Server",
    PROVIDERS_PAGE,
    "Settings",
)
TRAY_HINT = (
    "Hearth is still serving at {url}. Use the tray icon to open it again, stop the server or quit."
)


def app_icon() -> QIcon:
    """The flame icon (SVG, with a PNG fallback where the SVG plugin is missing)."""
    icon = QIcon(str(ASSETS / "hearth.svg"))
    if icon.pixmap(32, 32).isNull():
        icon = QIcon(str(ASSETS / "hearth.png"))
    return icon


class MainWindow(QMainWindow):
    """Navigation list on the left, one page per entry. Closing while the server runs keeps
    Hearth in the tray; closing while it is stopped quits."""

    shutdown_finished = Signal()  # the server is stopped; the application may exit
    hidden_to_tray = Signal()

    def __init__(self, ctx: GuiContext, bridge: Bridge, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._ctx = ctx
        self._bridge = bridge
        self._quitting = False
        self._launch_checked = False
        self._tray_hint_pending = False
        self.setWindowTitle("Hearth")
        self.setWindowIcon(app_icon())
        self.resize(1180, 740)
        self.setAcceptDrops(True)

        self.memory = MemoryMonitor(ctx.service, bridge, self)
        self.library_page = LibraryPage(ctx.service, bridge)
        self.discover_page = DiscoverPage(ctx.service, bridge)
        self.downloads_page = DownloadsPage(ctx.service, bridge)
        self.memory_page = MemoryPage(ctx.service, bridge, self.memory)
        self.chat_page = ChatPage(ctx.service, bridge)
        self.server_page = ServerPage(ctx.server, bridge)
        self.providers_page = ProvidersPage(ctx.service, bridge)
        self.autostart = Autostart()  # issue #13: start at login, this platform's way
        self.settings_page = SettingsPage(
            ctx.settings_store,
            bridge,
            tokens=TokenStore(ctx.paths.hf_token_file),
            runtime_report=report_source(ctx),
            default_models_dir=ctx.paths.models,
            autostart=self.autostart,
        )
        self.welcome = WelcomeView(
            ctx.service, bridge, ctx.settings_store, self.autostart, self._welcome_server_url
        )
        self.library_page.use_welcome(self.welcome)
        self.welcome.discover_requested.connect(self._on_welcome_discover_requested)

        self.nav = QListWidget()
        self.nav.setFixedWidth(168)
        self.nav.setIconSize(QSize(20, 20))
        self.nav.setStyleSheet(
            "QListWidget { border: none; outline: 0; background: palette(alternate-base); padding-top: 8px; }"
            "QListWidget::item { padding: 10px 14px; }"
        )
        font = self.nav.font()
        font.setPointSizeF(font.pointSizeF() * 1.15)
        self.nav.setFont(font)
        self.stack = QStackedWidget()
        for name, page in zip(
            PAGES,
            (
                self.library_page,
                self.discover_page,
                self.downloads_page,
                self.memory_page,
                self.chat_page,
                self.server_page,
                self.providers_page,
                self.settings_page,
            ),
            strict=True,
        ):
            QListWidgetItem(name, self.nav)
            self.stack.addWidget(page)
        self.nav.currentRowChanged.connect(self.stack.setCurrentIndex)
        self.nav.setCurrentRow(0)

        central = QWidget()
        row = QHBoxLayout(central)
        row.setContentsMargins(0, 0, 0, 0)
        row.setSpacing(0)
        row.addWidget(self.nav)
        row.addWidget(self.stack, 1)
        self.setCentralWidget(central)

        self.memory_status = QLabel()
        self.memory_status.setToolTip(f"Show the {MEMORY_PAGE.lower()}")
        self.memory_status.linkActivated.connect(self._on_memory_status_link_activated)
        self.statusBar().addPermanentWidget(self.memory_status)
        self.server_status = QLabel()
        self.statusBar().addPermanentWidget(self.server_status)

        self.tray = Tray(
            self.windowIcon(),
            self._server_url,
            parent=self,
            loaded_models=lambda: self.memory.snapshot.models,
            active_downloads=self.downloads_page.unfinished,
        )
        self.tray.download_action_requested.connect(self._on_tray_download_action_requested)
        self.tray.downloads_requested.connect(self._on_tray_downloads_requested)
        bridge.download_changed.connect(self._on_bridge_download_changed)
        self.tray.unload_requested.connect(self._on_tray_unload_requested)
        self.tray.menu_opened.connect(self._on_tray_menu_opened)
        self.memory.refreshed.connect(self._on_memory_refreshed)
        self.tray.start_requested.connect(self._on_tray_start_requested)
        self.tray.stop_requested.connect(self._on_tray_stop_requested)
        self.tray.open_requested.connect(self._on_tray_open_requested)
        self.tray.quit_requested.connect(self._on_tray_quit_requested)
        self.server_page.state_changed.connect(self._on_server_page_state_changed)
        self.providers_page.remote_models_changed.connect(
            self._on_providers_page_remote_models_changed
        )
        self.settings_page.settings_loaded.connect(self._on_settings_page_settings_loaded)
        self.settings_page.server_page_requested.connect(self._on_settings_page_server_requested)
        self.server_page.address_saved.connect(self.settings_page.show_address)
        self.server_page.address_saved.connect(lambda _s: self.welcome.update_server_text())
        self._on_server_page_state_changed(self.server_page.running)

    # -- navigation ----------------------------------------------------------------------------------
    def show_page(self, name: str) -> None:
        self.nav.setCurrentRow(PAGES.index(name))

    @property
    def current_page(self) -> str:
        return PAGES[self.stack.currentIndex()]

    def bring_to_front(self) -> None:
        """Show, un-minimize and raise the window (tray Open, a second launch)."""
        self.setWindowState(self.windowState() & ~Qt.WindowState.WindowMinimized)
        self.show()
        self.raise_()
        self.activateWindow()

    # -- lifecycle -----------------------------------------------------------------------------------
    def quit_app(self) -> None:
        """Stop the server cleanly on the loop, then emit ``shutdown_finished``."""
        if self._quitting:
            return
        self._quitting = True
        self.hide()
        self.tray.hide()
        if self._ctx.server.running:
            self._bridge.run(
                self._ctx.server.stop("quit"),
                on_done=self._on_server_stopped_for_quit,
                on_error=self._on_server_stop_failed_for_quit,
            )
        else:
            self.shutdown_finished.emit()

    def closeEvent(self, e: QCloseEvent) -> None:  # noqa: N802 - Qt override
        if self._quitting:
            e.accept()
            return
        if not self._ctx.server.running or not self._ctx.settings_store.load().keep_in_tray:
            e.accept()
            self.quit_app()
            return
        # the server keeps running: clients may depend on it
        e.ignore()
        if self.tray.available():
            self.hide()
            self._show_tray_hint_once()
        else:  # nowhere to hide to; keep a taskbar entry instead of vanishing
            self.showMinimized()
        self.hidden_to_tray.emit()

    def dragEnterEvent(self, e: QDragEnterEvent) -> None:  # noqa: N802 - Qt override
        self._accept_gguf_drag(e)

    def dragMoveEvent(self, e: QDragMoveEvent) -> None:  # noqa: N802 - Qt override
        self._accept_gguf_drag(e)

    @staticmethod
    def _accept_gguf_drag(e: QDragMoveEvent) -> None:
        if gguf_paths(e.mimeData()):
            e.acceptProposedAction()
        else:
            e.ignore()

    def dropEvent(self, e: QDropEvent) -> None:  # noqa: N802 - Qt override
        paths = gguf_paths(e.mimeData())
        if not paths:
            e.ignore()
            return
        e.acceptProposedAction()
        self.show_page("Library")
        self.library_page.import_files(paths)

    # -- slots ---------------------------------------------------------------------------------------
    def _on_welcome_discover_requested(self) -> None:
        self.show_page(DISCOVER_PAGE)

    def _on_tray_start_requested(self) -> None:
        self.server_page.start_server()

    def _on_tray_stop_requested(self) -> None:
        self.server_page.stop_server()

    def _on_tray_open_requested(self) -> None:
        self.bring_to_front()

    def _on_tray_quit_requested(self) -> None:
        self.quit_app()

    def _on_tray_unload_requested(self, model_id: str) -> None:
        self.memory_page.unload_model(model_id)

    def _on_tray_download_action_requested(self, action: str, download_id: str) -> None:
        page = self.downloads_page
        {"pause": page.pause, "resume": page.resume, "cancel": page.cancel}[action](download_id)

    def _on_tray_downloads_requested(self) -> None:
        self.show_page(DOWNLOADS_PAGE)
        self.bring_to_front()

    def _on_bridge_download_changed(self, _event: object) -> None:
        self.tray.downloads_changed()

    def _on_tray_menu_opened(self) -> None:
        self.memory.refresh()  # the menu was built from the cached snapshot; catch up if stale

    def _on_memory_refreshed(self, snapshot: MemorySnapshot) -> None:
        n = len(snapshot.models)
        what = f"{n} model{'s' if n != 1 else ''} in memory" if n else "No models in memory"
        self.memory_status.setText(
            f"<a href='memory'>{what}</a> · {human_bytes(snapshot.used)} of "
            f"{human_bytes(snapshot.budget)}"
        )
        self.tray.models_changed()

    def _on_memory_status_link_activated(self, _link: str) -> None:
        self.show_page(MEMORY_PAGE)

    def _on_server_page_state_changed(self, running: bool) -> None:
        url = self._server_url()
        self.server_status.setText(f"Server: {url}" if url else "Server: stopped")
        self.welcome.update_server_text()
        self.tray.rebuild_menu()

    def _on_settings_page_settings_loaded(self, s: Settings) -> None:
        self.server_page.apply_settings(s.server)
        self.welcome.update_server_text()
        if not self._launch_checked:
            self._launch_checked = True
            if s.server.start_at_launch:
                log.info("starting the server at launch (settings)")
                self.server_page.start_server()

    def _on_settings_page_server_requested(self) -> None:
        self.show_page("Server")
        self.server_page.host_edit.setFocus()

    def _on_providers_page_remote_models_changed(self) -> None:
        self.chat_page.refresh_models()  # a provider came up or went down: its models too

    def _on_server_stopped_for_quit(self, _: object) -> None:
        self.shutdown_finished.emit()

    def _on_server_stop_failed_for_quit(self, exc: BaseException) -> None:
        log.error("stopping the server on quit failed: %s", error_text(exc), exc_info=exc)
        self.shutdown_finished.emit()

    # -- helpers -------------------------------------------------------------------------------------
    def _server_url(self) -> str | None:
        server = self._ctx.server
        return server.base_url if server.running else None

    def _welcome_server_url(self) -> tuple[str, bool]:
        """The API's address and whether it runs: where it runs, else where it will (the saved
        host and port)."""
        if url := self._server_url():
            return url, True
        s = self.settings_page.settings or Settings()
        scheme = "https" if s.server.tls_cert else "http"
        return base_url(s.server.host, s.server.port, scheme), False

    def _show_tray_hint_once(self) -> None:
        if self._tray_hint_pending:
            return
        self._tray_hint_pending = True
        url = self._server_url() or ""
        store = self._ctx.settings_store

        def mark_shown() -> bool:
            # loop thread: read and flip the flag together so two windows never both show it
            if store.load().tray_hint_shown:
                return False
            store.update(tray_hint_shown=True)
            return True

        def done(first: bool) -> None:
            if first:
                self.tray.show_message("Hearth is still running", TRAY_HINT.format(url=url))

        self._bridge.call(mark_shown, on_done=done)


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
