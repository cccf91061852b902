"""The Server page: start and stop the local OpenAI-compatible API and watch its requests."""

from __future__ import annotations

import logging
from dataclasses import replace

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QGuiApplication, QPalette
from PySide6.QtWidgets import (
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QScrollArea,
    QSpinBox,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from app.core.events import RequestFinished
from app.core.gateway.keys import KeyStore
from app.gui.bridge import Bridge, error_text, log_failure
from app.gui.views.common import PAGE_MARGINS, MessageBanner, page_title
from app.gui.views.server.api_keys import KeysSection
from app.gui.views.server.charts.prompt_cache import CacheChart
from app.gui.views.server.charts.speed import SpeedChart
from app.gui.views.server.request_log import RequestLogView
from app.gui.views.server.response_cache import CacheSection
from app.server.runner import ServerController
from app.settings import ServerSettings, Settings

log = logging.getLogger(__name__)


class ServerPage(QWidget):
    """Start/Stop, address fields, the base URL to copy, the tok/s and cache/batch charts and the
    live request log."""

    state_changed = Signal(bool)  # running
    address_saved = Signal(object)  # ServerSettings: the address a start used, now the saved one

    def __init__(
        self, server: ServerController, bridge: Bridge, parent: QWidget | None = None
    ) -> None:
        super().__init__(parent)
        self._server = server
        self._bridge = bridge
        self._busy = False
        self._starting = False  # busy starting (not stopping)
        self._stop_after_start = False
        self._starting_on: tuple[str, int] | None = None  # the address of the start under way
        # the request log reads the records database (app/gui/views/server/request_log.py)
        self.request_log = RequestLogView(server.paths.requests_db, bridge)
        self.request_model = self.request_log.model
        self.request_table = self.request_log.table
        self.speed_chart = SpeedChart()
        self.cache_chart = CacheChart()

        self.host_edit = QLineEdit("127.0.0.1")
        self.host_edit.setToolTip(
            "127.0.0.1 keeps the server on this computer; 0.0.0.0 opens it "
            "to your network (needs an API key)."
        )
        self.host_edit.setMaximumWidth(320)
        self.port_spin = QSpinBox()
        self.port_spin.setMinimumWidth(130)
        self.port_spin.setRange(0, 65535)  # 0: let the system pick a free port
        self.port_spin.setSpecialValueText("any free port")
        self.start_button = QPushButton("Start server")
        self.stop_button = QPushButton("Stop server")
        self.status_label = QLabel("Stopped")
        self.url_edit = QLineEdit()
        self.url_edit.setReadOnly(True)
        self.url_edit.setPlaceholderText("The base URL appears here while the server runs")
        self.copy_button = QPushButton("Copy")
        self.banner = MessageBanner()

        header = QHBoxLayout()
        header.addWidget(page_title("Server"))
        header.addStretch(1)
        header.addWidget(self.start_button)
        header.addWidget(self.stop_button)

        address = QHBoxLayout()
        address.addWidget(self.host_edit, 1)
        address.addSpacing(12)
        address.addWidget(QLabel("Port"))
        address.addWidget(self.port_spin)
        address.addStretch(1)
        url_row = QHBoxLayout()
        url_row.addWidget(self.url_edit, 1)
        url_row.addWidget(self.copy_button)
        form = QFormLayout()
        form.addRow("Host", address)
        form.addRow("Status", self.status_label)
        form.addRow("Base URL", url_row)

        hint = QLabel(
            "Point any OpenAI client at the base URL, e.g.<br>"
            '<code>OpenAI(base_url=URL, api_key="hearth")</code>.'
        )
        # two lines, not word wrap: narrow enough for the window's minimum width, and no
        # height-for-width, which would make the page's scroll area take its full height
        hint.setForegroundRole(QPalette.ColorRole.PlaceholderText)  # muted, on any theme

        layout = QVBoxLayout(self)
        layout.setContentsMargins(*PAGE_MARGINS)
        layout.addLayout(header)
        layout.addWidget(self.banner)
        layout.addLayout(form)
        layout.addWidget(hint)
        layout.addWidget(self._charts_and_requests(), 1)

        self.start_button.clicked.connect(self._on_start_button_clicked)
        self.stop_button.clicked.connect(self._on_stop_button_clicked)
        self.copy_button.clicked.connect(self._on_copy_button_clicked)
        bridge.server_started.connect(self._on_bridge_server_started)
        bridge.server_stopped.connect(self._on_bridge_server_stopped)
        bridge.request_finished.connect(self._on_bridge_request_finished)
        self._show_state()

    def _charts_and_requests(self) -> QSplitter:
        """The charts (scrolling when the window is short) over the request log, split so
        neither is drawn over the other at any window size; the log takes the spare height."""
        charts = QWidget()
        cl = QVBoxLayout(charts)
        cl.setContentsMargins(0, 0, 0, 0)
        cl.addWidget(QLabel("Speed of recent generations"))
        cl.addWidget(self.speed_chart)
        cl.addWidget(QLabel("Prompt cache and batching of recent generations"))
        cl.addWidget(self.cache_chart)
        cl.addStretch(1)
        self.charts_area = QScrollArea()
        self.charts_area.setWidget(charts)
        self.charts_area.setWidgetResizable(True)
        self.charts_area.setFrameShape(QScrollArea.Shape.NoFrame)
        self.charts_area.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.splitter = QSplitter(Qt.Orientation.Vertical)
        self.splitter.addWidget(self.charts_area)
        self.splitter.addWidget(self.request_log)
        self.keys_section = KeysSection(KeyStore(self._server.paths.keys_file), self._bridge)
        self.splitter.addWidget(self.keys_section)
        paths = self._server.paths  # the response cache's box
        self.cache_section = CacheSection(
            self._server.settings_store, paths.response_cache_db, self._bridge
        )
        self.splitter.addWidget(self.cache_section)
        self.splitter.setChildrenCollapsible(False)
        self.splitter.setStretchFactor(0, 0)
        self.splitter.setStretchFactor(1, 1)
        return self.splitter

    # -- state -------------------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self._server.running

    @property
    def base_url(self) -> str | None:
        return self._server.base_url

    def apply_settings(self, server: ServerSettings) -> None:
        """Fill the address fields from the settings (unless the server is running on others)."""
        if not self.running:
            self.host_edit.setText(server.host)
            self.port_spin.setValue(server.port)

    # -- actions -------------------------------------------------------------------------------------
    def start_server(self) -> None:
        if self.running or self._busy:
            return
        host = self.host_edit.text().strip() or "127.0.0.1"
        self._busy = True
        self._starting = True
        self._starting_on = (host, self.port_spin.value())
        self.banner.clear_message()
        self.status_label.setText(f"Starting on {host}:{self.port_spin.value() or 'any port'}…")
        self._update_buttons()
        self._bridge.run(
            self._server.start(host, self.port_spin.value()),
            on_done=self._on_start_done,
            on_error=self._on_start_failed,
        )

    def stop_server(self) -> None:
        if self._busy and self._starting:
            self._stop_after_start = True  # Stop right after Start (tray): honour it once started
            return
        if not self.running or self._busy:
            return
        self._busy = True
        self.status_label.setText("Stopping…")
        self._update_buttons()
        self._bridge.run(
            self._server.stop(), on_done=self._on_stop_done, on_error=self._on_stop_failed
        )

    def copy_url(self) -> None:
        if self.url_edit.text():
            QGuiApplication.clipboard().setText(self.url_edit.text())
            self.banner.show_message("Copied the base URL to the clipboard.")

    # -- slots ---------------------------------------------------------------------------------------
    def _on_start_button_clicked(self) -> None:
        self.start_server()

    def _on_stop_button_clicked(self) -> None:
        self.stop_server()

    def _on_copy_button_clicked(self) -> None:
        self.copy_url()

    def _on_start_done(self, _url: str) -> None:
        self._busy = self._starting = False
        self._show_state()
        if self._starting_on is not None:
            self._save_address(*self._starting_on)
        if self._stop_after_start:
            self._stop_after_start = False
            self.stop_server()

    def _on_start_failed(self, exc: BaseException) -> None:
        self._busy = self._starting = self._stop_after_start = False
        self.banner.show_message(log_failure(log, "server did not start", exc), "error")
        self._show_state()

    def _on_stop_done(self, _: object) -> None:
        self._busy = False
        self._show_state()

    def _on_stop_failed(self, exc: BaseException) -> None:
        self._busy = False
        log.error("server stop failed", exc_info=exc)
        self.banner.show_message(f"Stopping the server failed: {error_text(exc)}", "error")
        self._show_state()

    def _on_bridge_server_started(self, *_: object) -> None:
        self._show_state()

    def _on_bridge_server_stopped(self, *_: object) -> None:
        self._show_state()

    def _on_bridge_request_finished(self, event: RequestFinished) -> None:
        self.speed_chart.add(event)  # the request log reads the event itself
        self.cache_chart.add(event)

    # -- helpers -------------------------------------------------------------------------------------
    def _save_address(self, host: str, port: int) -> None:
        """This page is where the address is edited: the one a start used is the one the next
        start (at launch, ``hearth serve``) uses."""
        store = self._server.settings_store

        def write() -> Settings:
            s = store.load()
            if (s.server.host, s.server.port) != (host, port):
                s = replace(s, server=replace(s.server, host=host, port=port))
                store.save(s)
            return s

        self._bridge.call(
            write,
            on_done=lambda s: self.address_saved.emit(s.server),
            on_error=lambda exc: self.banner.show_message(
                log_failure(log, "saving the server address", exc), "error"
            ),
        )

    def _show_state(self) -> None:
        url = self.base_url if self.running else None
        if not self._busy:
            self.status_label.setText(f"Running at {url}" if url else "Stopped")
        self.url_edit.setText(url or "")
        self._update_buttons()
        self.state_changed.emit(bool(url))

    def _update_buttons(self) -> None:
        running = self.running
        self.start_button.setEnabled(not running and not self._busy)
        self.stop_button.setEnabled(running and not self._busy)
        self.host_edit.setEnabled(not running and not self._busy)
        self.port_spin.setEnabled(not running and not self._busy)
        self.copy_button.setEnabled(bool(self.url_edit.text()))
