"""The first-run welcome: what the Library page shows while the library is empty.

It says what the server is for, suggests a few small models that fit this machine (looked up on
the Hub, downloaded only when the user picks one), offers Discover and import, and the two
switches a new user wants: start at login and keep running in the tray.
"""

from __future__ import annotations

import html
import logging
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QFrame,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QScrollArea,
    QVBoxLayout,
    QWidget,
)

from app.core.desktop.autostart import Autostart
from app.core.hub.downloads import DownloadStatus
from app.core.hub.starters import Suggestion, suggest
from app.core.service import Hearth
from app.errors import HubUnavailable
from app.gui.bridge import Bridge, log_failure
from app.gui.models.hub import fit_text
from app.gui.tray import Tray
from app.gui.units import human_bytes
from app.gui.views.common import MessageBanner
from app.gui.views.settings.autostart_check import StartAtLoginCheck
from app.settings import Settings, SettingsStore

log = logging.getLogger(__name__)

SERVER_TEXT = (
    "Hearth serves the models you load on an OpenAI-, Anthropic- and Ollama-compatible API at "
    "<code>{url}</code>, for your editor, agents and other tools."
)
SERVER_STOPPED_TEXT = (
    " Start the server on the Server page (or have it start with Hearth in Settings)."
)
LOOKING_TEXT = "Looking up small models that fit this machine…"
OFFLINE_TEXT = (
    "You're offline: the Hugging Face Hub ({host}) can't be reached, so Hearth cannot suggest "
    "models now. You can still import a GGUF file you have."
)
NO_HUB_TEXT = "Downloading from the Hugging Face Hub is not available in this session."
NONE_FIT_TEXT = "None of the suggested models fits this machine's memory budget ({budget})."
NO_TRAY_TIP = (
    "This desktop has no tray. Closing the window while the server runs asks whether to keep "
    "serving or quit (Settings › Window)."
)


@dataclass
class SuggestionRow:
    """The widgets of one suggested model (tests read them)."""

    suggestion: Suggestion
    size_label: QLabel
    fit_label: QLabel
    download_button: QPushButton


class WelcomeView(QWidget):
    """The welcome; ``load_suggestions()`` asks the Hub (the Library page calls it once the
    library is known to be empty)."""

    discover_requested = Signal()
    download_queued = Signal(str)  # download id
    suggestions_shown = Signal()  # the list (or why there is none) is on screen
    keep_in_tray_saved = Signal(bool)

    def __init__(
        self,
        service: Hearth,
        bridge: Bridge,
        store: SettingsStore,
        autostart: Autostart,
        server_url: Callable[[], tuple[str, bool]],
        parent: QWidget | None = None,
    ) -> None:
        super().__init__(parent)
        self._service = service
        self._bridge = bridge
        self._store = store
        self._server_url = server_url
        self._loading = False
        self.loaded = False  # suggestions were shown (a failure leaves this False: retry)
        self.rows: dict[str, SuggestionRow] = {}

        title = QLabel("<h2>Welcome to Hearth</h2>")
        self.server_label = QLabel()
        self.server_label.setWordWrap(True)
        self.server_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.banner = MessageBanner()

        self.status_label = QLabel()
        self.status_label.setWordWrap(True)
        self.retry_button = QPushButton("Try again")
        self.retry_button.hide()
        self._grid_host = QWidget()
        self.grid = QGridLayout(self._grid_host)
        self.grid.setContentsMargins(0, 0, 0, 0)
        self.grid.setHorizontalSpacing(16)
        self.grid.setVerticalSpacing(10)
        self.grid.setColumnStretch(0, 1)
        self.more_label = QLabel()
        self.more_label.setWordWrap(True)
        self.more_label.hide()

        self.discover_button = QPushButton("Discover more models…")
        self.import_button: QPushButton | None = None  # the Library page's (place_import)

        self.start_at_login_check = StartAtLoginCheck(autostart, store, bridge)
        self.keep_in_tray_check = QCheckBox("Keep running in the tray when I close the window")
        self.keep_in_tray_check.setToolTip(
            "On: closing the window leaves Hearth (and a running server) in the tray; with no "
            "tray, it asks. Off: closing the window quits Hearth. Also in Settings › Window."
        )

        body = QWidget()
        col = QVBoxLayout(body)
        col.setContentsMargins(0, 0, 0, 0)
        col.addWidget(title)
        col.addWidget(self.server_label)
        col.addWidget(self.banner)
        col.addSpacing(8)
        col.addWidget(QLabel("<b>Start with a small model</b>"))
        status_row = QHBoxLayout()
        status_row.addWidget(self.status_label, 1)
        status_row.addWidget(self.retry_button)
        col.addLayout(status_row)
        col.addWidget(self._grid_host)
        col.addWidget(self.more_label)
        self._buttons = QHBoxLayout()
        self._buttons.addWidget(self.discover_button)
        self._buttons.addStretch(1)
        col.addLayout(self._buttons)
        self._import_hint_at = col.count()
        self._col = col
        col.addSpacing(8)
        line = QFrame()
        line.setFrameShape(QFrame.Shape.HLine)
        line.setFrameShadow(QFrame.Shadow.Sunken)
        col.addWidget(line)
        col.addWidget(self.start_at_login_check)
        col.addWidget(self.keep_in_tray_check)
        col.addStretch(1)

        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QFrame.Shape.NoFrame)
        scroll.setWidget(body)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(scroll)

        self.discover_button.clicked.connect(self.discover_requested)
        self.retry_button.clicked.connect(self._on_retry_button_clicked)
        self.keep_in_tray_check.toggled.connect(self._on_keep_in_tray_check_toggled)
        self.start_at_login_check.failed.connect(self._show_error)
        self.update_server_text()
        self._bridge.call(store.load, on_done=self._on_settings_read)

    # -- public --------------------------------------------------------------------------------------
    @property
    def status_text(self) -> str:
        return self.status_label.text() if self.status_label.isVisibleTo(self) else ""

    def place_import(self, hint: QLabel, button: QPushButton) -> None:
        """Put the Library page's import button beside Discover and its hint below them."""
        self.import_button = button
        self._buttons.insertWidget(1, button)
        self._col.insertWidget(self._import_hint_at, hint)

    def update_server_text(self) -> None:
        url, running = self._server_url()
        text = SERVER_TEXT.format(url=html.escape(url))
        self.server_label.setText(text if running else text + SERVER_STOPPED_TEXT)

    def load_suggestions(self) -> None:
        """Ask the Hub for the starters (once; again after a failure)."""
        dm = self._service.hub
        if self.loaded or self._loading:
            return
        if dm is None:
            self._show_status(NO_HUB_TEXT)
            self.suggestions_shown.emit()
            return
        self._loading = True
        self._show_status(LOOKING_TEXT)
        self.retry_button.hide()
        service = self._service

        async def look_up() -> tuple[list[Suggestion], int, int]:
            budget = service.models.memory()["budget"]  # on the loop, like every service call
            shown, too_large = await suggest(dm.hub, budget)
            return shown, too_large, budget

        self._bridge.run(look_up(), self._on_suggested, self._on_suggest_failed)

    def download(self, repo_id: str) -> None:
        """Queue the suggested model's file, as Discover's Download does."""
        dm, row = self._service.hub, self.rows.get(repo_id)
        if dm is None or row is None:
            return
        info, option = row.suggestion.info, row.suggestion.option
        row.download_button.setEnabled(False)
        row.download_button.setText("Downloading…")
        self.banner.clear_message()

        async def queue() -> DownloadStatus:
            plan = await dm.plan_for(info, option)
            return await dm.start(plan)

        def done(status: DownloadStatus) -> None:
            self.banner.show_message(
                html.escape(
                    f"Downloading {status.name} ({human_bytes(status.total_bytes)}). It shows "
                    "up here when it is done; the Downloads page shows its progress."
                )
            )
            self.download_queued.emit(status.id)

        def failed(exc: BaseException) -> None:
            row.download_button.setEnabled(True)
            row.download_button.setText("Download")
            self._show_error(log_failure(log, f"download of {info.id}", exc))

        self._bridge.run(queue(), done, failed)

    # -- slots ---------------------------------------------------------------------------------------
    def _on_settings_read(self, s: Settings) -> None:
        # no tray (stock GNOME, bare X11): nothing to keep running in, so never ticked
        tray = Tray.available()
        self.keep_in_tray_check.blockSignals(True)
        self.keep_in_tray_check.setChecked(tray and s.ui.close_action != "quit")
        self.keep_in_tray_check.blockSignals(False)
        self.keep_in_tray_check.setEnabled(tray)
        if not tray:
            self.keep_in_tray_check.setToolTip(NO_TRAY_TIP)

    def _on_keep_in_tray_check_toggled(self, on: bool) -> None:
        store = self._store
        self._bridge.call(
            # the same choice as Settings › Window's "Closing the window while serving"
            lambda: store.update_ui(close_action="ask" if on else "quit"),
            on_done=lambda _s: self.keep_in_tray_saved.emit(on),
            on_error=lambda exc: self._show_error(log_failure(log, "keep in tray", exc)),
        )

    def _on_download_button_clicked(self) -> None:
        button = self.sender()
        if isinstance(button, QPushButton):
            self.download(str(button.property("repo_id")))

    def _on_retry_button_clicked(self) -> None:
        self.load_suggestions()

    def _on_suggested(self, result: tuple[list[Suggestion], int, int]) -> None:
        self._loading = False
        self.loaded = True
        shown, too_large, budget = result
        self._clear_rows()
        if shown:
            self.status_label.hide()
        else:
            self._show_status(NONE_FIT_TEXT.format(budget=human_bytes(budget)))
        for i, s in enumerate(shown):
            self._add_row(i, s)
        if too_large and shown:
            what = "model needs" if too_large == 1 else "models need"
            self.more_label.setText(
                f"{too_large} more suggested {what} more memory than this machine's budget "
                f"({human_bytes(budget)}); Discover lists every size."
            )
        self.more_label.setVisible(bool(too_large and shown))
        self.suggestions_shown.emit()

    def _on_suggest_failed(self, exc: BaseException) -> None:
        self._loading = False
        text = log_failure(log, "starter models", exc)
        dm = self._service.hub
        if isinstance(exc, HubUnavailable) and dm is not None:
            host = urlsplit(dm.hub.endpoint).netloc or dm.hub.endpoint
            self._show_status(OFFLINE_TEXT.format(host=html.escape(host)))
        else:
            self._show_status(html.escape(f"Could not look up suggested models: {text}"))
        self.retry_button.show()
        self.suggestions_shown.emit()

    # -- helpers -------------------------------------------------------------------------------------
    def _add_row(self, i: int, s: Suggestion) -> None:
        name = QLabel(
            f"<b>{html.escape(s.info.id)}</b> · {html.escape(s.option.name)}<br>"
            f"<span>{html.escape(s.starter.blurb)}</span>"
        )
        size = QLabel(human_bytes(s.option.size_bytes))
        verdict = QLabel(fit_text(s.option))
        if s.option.estimate is not None:
            verdict.setToolTip(f"Needs about {human_bytes(s.option.estimate.total)}")
        button = QPushButton("Download")
        button.setProperty("repo_id", s.info.id)
        button.clicked.connect(self._on_download_button_clicked)
        for col, w in enumerate((name, size, verdict, button)):
            self.grid.addWidget(w, i, col)
        self.rows[s.info.id] = SuggestionRow(s, size, verdict, button)

    def _clear_rows(self) -> None:
        self.rows.clear()
        while (item := self.grid.takeAt(0)) is not None:
            if (w := item.widget()) is not None:
                w.deleteLater()

    def _show_status(self, text: str) -> None:
        self.status_label.setText(text)
        self.status_label.show()

    def _show_error(self, text: str) -> None:
        self.banner.show_message(html.escape(text), "error")
