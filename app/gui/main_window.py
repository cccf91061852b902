"""The main window: the sidebar's pages, the menus, closing and the tray's requests.
Tested by tests/gui/test_tray.py and tests/gui/test_pages.py; ``launch.run_gui`` shows it."""

from __future__ import annotations

import logging
from collections.abc import Callable

from PySide6.QtCore import QSignalBlocker, QSize, Qt, Signal
from PySide6.QtGui import (
    QAction,
    QCloseEvent,
    QDragEnterEvent,
    QDragMoveEvent,
    QDropEvent,
    QGuiApplication,
    QKeySequence,
)
from PySide6.QtWidgets import (
    QHBoxLayout,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QMainWindow,
    QStackedWidget,
    QWidget,
)

from app.core.desktop.autostart import Autostart
from app.gui.about import add_help_menu, app_icon
from app.gui.bridge import Bridge, error_text
from app.gui.context import GuiContext
from app.gui.models.memory import MemoryMonitor, MemorySnapshot
from app.gui.theme import apply_theme, theme_signals
from app.gui.tray import Tray
from app.gui.units import human_bytes
from app.gui.views.chat.page import ChatPage
from app.gui.views.chat.session import open_store
from app.gui.views.connect import TITLE as CONNECT_PAGE
from app.gui.views.connect import ConnectPage
from app.gui.views.discover import TITLE as DISCOVER_PAGE
from app.gui.views.discover import DiscoverPage
from app.gui.views.downloads import TITLE as DOWNLOADS_PAGE
from app.gui.views.downloads import DownloadsPage
from app.gui.views.library.memory import TITLE as MEMORY_PAGE
from app.gui.views.library.memory import MemoryPage
from app.gui.views.library.page import LibraryPage, gguf_paths
from app.gui.views.library.welcome import WelcomeView
from app.gui.views.providers.page import TITLE as PROVIDERS_PAGE
from app.gui.views.providers.page import ProvidersPage
from app.gui.views.server.page import ServerPage
from app.gui.views.settings.page import SettingsPage
from app.gui.views.settings.runtime_info import report_source
from app.gui.window_state import (
    DEFAULT_SIZE,
    MINIMUM_SIZE,
    CloseDialog,
    PageScroller,
    restored_geometry,
)
from app.server.runner import planned_url
from app.settings import Settings, TokenStore, WindowState

log = logging.getLogger(__name__)

PAGES = (
    "Library",
    DISCOVER_PAGE,
    DOWNLOADS_PAGE,
    MEMORY_PAGE,
    "Chat",
    "Server",
    CONNECT_PAGE,
    PROVIDERS_PAGE,
    "Settings",
)
TRAY_HINT = (
    "Hearth is still serving at {url}. Use the tray icon to open it again, stop the server or quit."
)


class MainWindow(QMainWindow):
    """Navigation list on the left, one page per entry. Closing while the server runs keeps
    Hearth in the tray (with no tray it asks: keep serving in the background, or quit) unless
    ``ui.close_action`` is "quit"; closing while it is stopped quits. File > Quit, the tray's Quit and
    Ctrl+Q quit. ``tray_available`` decides whether the desktop has a tray (a seam for tests)."""

    shutdown_finished = Signal()  # the server is stopped; the application may exit
    hidden_to_tray = Signal()
    kept_in_background = Signal()  # closed with no tray; the server keeps serving

    def __init__(
        self,
        ctx: GuiContext,
        bridge: Bridge,
        parent: QWidget | None = None,
        *,
        tray_available: Callable[[], bool] | None = None,
    ) -> None:
        super().__init__(parent)
        self._ctx = ctx
        self._bridge = bridge
        self._quitting = False
        self._launch_checked = False
        self._tray_hint_pending = False
        self._tray_available = tray_available or (lambda: Tray.available())
        self.close_dialog: CloseDialog | None = None
        self.setWindowTitle("Hearth")
        self.setWindowIcon(app_icon())
        self.setMinimumSize(MINIMUM_SIZE)
        self.resize(DEFAULT_SIZE)
        self.setAcceptDrops(True)

        self.memory = MemoryMonitor(ctx.service, bridge, self)
        self.library_page = LibraryPage(ctx.service, bridge)
        self.discover_page = DiscoverPage(ctx.service, bridge)
        self.downloads_page = DownloadsPage(ctx.service, bridge)
        self.memory_page = MemoryPage(ctx.service, bridge, self.memory)
        convs = open_store(ctx.paths.conversations_db)  # saved conversations
        self.chat_page = ChatPage(
            ctx.service, bridge, conversations=convs, mcp=ctx.mcp,
            settings=ctx.settings_store, cache_root=ctx.paths.cache,
        )  # fmt: skip
        self.server_page = ServerPage(ctx.server, bridge)
        self.connect_page = ConnectPage(ctx, bridge)  # settings for other apps
        self.providers_page = ProvidersPage(ctx.service, bridge)
        self.autostart = Autostart()  # start at login, this platform's way
        self.settings_page = SettingsPage(
            ctx.settings_store,
            bridge,
            tokens=TokenStore(ctx.paths.hf_token_file),
            runtime_report=report_source(ctx),
            default_models_dir=ctx.paths.models,
            autostart=self.autostart,
            mcp=ctx.mcp,
        )
        self.welcome = WelcomeView(
            ctx.service, bridge, ctx.settings_store, self.autostart, self._welcome_server_url
        )
        self.library_page.use_welcome(self.welcome)
        self.welcome.discover_requested.connect(self._on_welcome_discover_requested)
        self.welcome.keep_in_tray_saved.connect(self._on_welcome_keep_in_tray_saved)

        self.nav = QListWidget()
        self.nav.setFixedWidth(168)
        self.nav.setIconSize(QSize(20, 20))
        self._style_nav()
        theme_signals().changed.connect(self._style_nav)
        font = self.nav.font()
        font.setPointSizeF(font.pointSizeF() * 1.15)
        self.nav.setFont(font)
        self.stack = QStackedWidget()
        self.pages: tuple[QWidget, ...] = (
            self.library_page,
            self.discover_page,
            self.downloads_page,
            self.memory_page,
            self.chat_page,
            self.server_page,
            self.connect_page,
            self.providers_page,
            self.settings_page,
        )
        for name, page in zip(PAGES, self.pages, strict=True):
            item = QListWidgetItem(name, self.nav)
            item.setToolTip(f"{name} ({_page_key(self.stack.count()).toString(_NATIVE)})")
            self.stack.addWidget(PageScroller(page))
        self.nav.currentRowChanged.connect(self._on_nav_row_changed)
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
        self.server_page.address_saved.connect(self.connect_page.refresh)
        self.settings_page.settings_loaded.connect(self.connect_page.refresh)
        self.settings_page.theme_chosen.connect(apply_theme)
        self.memory_page.reload_requested.connect(self.library_page.open_load_dialog)
        self._on_server_page_state_changed(self.server_page.running)
        self._build_menus()
        self.about_action = add_help_menu(self, ctx.paths)
        self.restore_window_state(ctx.settings_store.load().ui.window)

    def _build_menus(self) -> None:
        file_menu = self.menuBar().addMenu("&File")
        self.new_chat_action = QAction("New chat", self)
        self.new_chat_action.setShortcut(QKeySequence.StandardKey.New)
        self.new_chat_action.triggered.connect(self._on_new_chat_action_triggered)
        self.quit_action = QAction("Quit Hearth", self)
        self.quit_action.setShortcut(QKeySequence.StandardKey.Quit)
        self.quit_action.setMenuRole(QAction.MenuRole.QuitRole)
        self.quit_action.triggered.connect(self._on_quit_action_triggered)
        file_menu.addAction(self.new_chat_action)
        file_menu.addSeparator()
        file_menu.addAction(self.quit_action)
        if self.quit_action.shortcut().isEmpty():  # no platform Quit key (some X11 themes)
            self.quit_action.setShortcut(QKeySequence("Ctrl+Q"))
        go_menu = self.menuBar().addMenu("&Go")
        self.page_actions: list[QAction] = []
        for i, name in enumerate(PAGES):
            action = QAction(name, self)
            action.setShortcut(_page_key(i))
            action.triggered.connect(lambda _c=False, n=name: self.show_page(n))
            go_menu.addAction(action)
            self.page_actions.append(action)

    def _style_nav(self) -> None:
        # outline 0 drops the dotted focus rectangle; the item border is the focus outline.
        # Re-set on a theme change: a style sheet's palette() colours are read when it is set
        self.nav.setStyleSheet("")
        self.nav.setStyleSheet(_NAV_STYLE)

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
        if self.isVisible():
            self.save_window_state()
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
        if not self.settings_page.ask_leave(self.close):  # unsaved settings: asked first
            e.ignore()
            return
        action = self._ctx.settings_store.load().ui.close_action  # from memory, no file read
        if not self._ctx.server.running or action == "quit":
            e.accept()
            self.quit_app()
            return
        # the server keeps running: clients may depend on it
        e.ignore()
        if self._tray_available():
            self.save_window_state()
            self.hide()
            self._show_tray_hint_once()
            self.hidden_to_tray.emit()
            return
        if action == "background":
            self.keep_serving_in_background()
        else:
            self.ask_how_to_close()

    def _on_nav_row_changed(self, row: int) -> None:
        """Show page ``row``; leaving Settings with unsaved changes asks first (Cancel stays)."""
        here = self.pages.index(self.settings_page)
        if self.stack.currentIndex() == here != row and not self.settings_page.ask_leave(
            lambda: self.nav.setCurrentRow(row)  # after Apply or Discard
        ):
            with QSignalBlocker(self.nav):
                self.nav.setCurrentRow(here)
            return
        self.stack.setCurrentIndex(row)

    def ask_how_to_close(self) -> None:
        """No tray to hide to: ask whether to keep serving in the background or to quit."""
        if self.close_dialog is not None:
            self.close_dialog.raise_()
            return
        dialog = CloseDialog(self._server_url() or "", self)
        dialog.finished.connect(self._on_close_dialog_finished)
        self.close_dialog = dialog
        dialog.open()

    def keep_serving_in_background(self) -> None:
        """Hide with no tray: a second ``hearth`` launch brings the window back (instance.py)."""
        self.save_window_state()
        self.hide()
        log.info(
            "window closed; still serving at %s (run hearth again to reopen)", self._server_url()
        )
        self.kept_in_background.emit()

    def restore_window_state(self, saved: WindowState) -> None:
        """Reopen where the window was (on a screen that is still there) and on its last page."""
        screens = [s.availableGeometry() for s in QGuiApplication.screens()]
        rect = restored_geometry(saved, screens, self.minimumSize())
        if rect is not None:
            self.resize(rect.size())
            self.move(rect.topLeft())
        if saved.maximized:
            self.setWindowState(self.windowState() | Qt.WindowState.WindowMaximized)
        if saved.page in PAGES:
            self.show_page(saved.page)

    def window_state(self) -> WindowState:
        """The place to save: the frame's position (what ``move`` takes, so a restart does not
        drift by the title bar's height) and the client size; the normal ones when maximized."""
        x, y, size = self.x(), self.y(), self.size()
        normal = self.normalGeometry()
        if self.isMaximized() and normal.isValid():
            frame = self.geometry().topLeft() - self.pos()
            x, y, size = normal.x() - frame.x(), normal.y() - frame.y(), normal.size()
        return WindowState(
            x=x,
            y=y,
            width=size.width(),
            height=size.height(),
            maximized=self.isMaximized(),
            page=self.current_page,
        )

    def save_window_state(self) -> None:
        """Remember size, position, maximized and page in ``ui.window``. On the GUI thread: it
        runs as the app quits, when the loop may already be stopping; one small write."""
        state = self.window_state()
        store = self._ctx.settings_store
        try:
            if store.load().ui.window != state:
                store.update_ui(window=state)
        except OSError as exc:
            log.warning("could not save the window's place: %s", exc)

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

    def _on_quit_action_triggered(self) -> None:
        self.quit_app()

    def _on_new_chat_action_triggered(self) -> None:
        self.show_page("Chat")
        self.chat_page.new_chat()

    def _on_close_dialog_finished(self, _result: int) -> None:
        dialog = self.close_dialog
        self.close_dialog = None
        if dialog is None:
            return
        choice = dialog.choice()
        dialog.deleteLater()
        if choice and dialog.remember_check.isChecked():
            store = self._ctx.settings_store
            self._bridge.call(lambda: store.update_ui(close_action=choice))
            self.settings_page.show_saved_ui(close_action=choice)
        if choice == "quit":
            self.quit_app()
        elif choice == "background":
            self.keep_serving_in_background()

    def _on_welcome_keep_in_tray_saved(self, on: bool) -> None:
        # one setting, shown in both places
        self.settings_page.show_saved_ui(close_action="ask" if on else "quit")

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
        return planned_url((self.settings_page.settings or Settings()).server), False

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


_NATIVE = QKeySequence.SequenceFormat.NativeText
_NAV_STYLE = (
    "QListWidget { border: none; outline: 0; background: palette(alternate-base);"
    " padding-top: 8px; }"
    "QListWidget::item { padding: 8px 12px; border: 2px solid transparent; }"
    "QListWidget::item:selected { background: palette(highlight);"
    " color: palette(highlighted-text); }"
    "QListWidget::item:focus { border: 2px solid palette(text); }"
)


def _page_key(index: int) -> QKeySequence:
    """Ctrl+1 … Ctrl+9 for the sidebar's pages, in order."""
    return QKeySequence(f"Ctrl+{index + 1}")
