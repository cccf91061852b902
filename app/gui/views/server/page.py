"""The Server page: start and stop the local OpenAI-compatible API and watch its requests."""

from __future__ import annotations

import logging
from dataclasses import replace

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QResizeEvent
from PySide6.QtWidgets import (
    QBoxLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QScrollArea,
    QSpinBox,
    QSplitter,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from app.core.events import RequestFinished
from app.core.gateway.keys import KeyStore
from app.gui.bridge import Bridge, error_text, log_failure
from app.gui.views.common import PAGE_MARGINS, MessageBanner, page_title
from app.gui.views.copied import copy_text
from app.gui.views.server.api_keys import KeysSection
from app.gui.views.server.charts.prompt_cache import CacheChart
from app.gui.views.server.charts.speed import SpeedChart
from app.gui.views.server.log_tail import LogTail
from app.gui.views.server.request_log import RequestLogView
from app.gui.views.server.response_cache import CacheSection
from app.server.runner import ServerController
from app.settings import ServerSettings, Settings

log = logging.getLogger(__name__)

CHART_MIN_WIDTH = 450  # px: a chart's two series with their headers unclipped


class ServerPage(QWidget):
    """Start/Stop, address fields and the base URL to copy over two tabs: Activity (the tok/s and
    cache/batch charts, the live request log and the app's log) and Access & cache (API keys and
    the response cache)."""

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
        header.addSpacing(12)
        header.addWidget(self.status_label)
        header.addStretch(1)
        header.addWidget(self.start_button)
        header.addWidget(self.stop_button)

        # one row for the address and the URL: the space below goes to what users watch
        address = QHBoxLayout()
        address.addWidget(QLabel("Host"))
        address.addWidget(self.host_edit, 1)
        address.addWidget(QLabel("Port"))
        address.addWidget(self.port_spin)
        address.addSpacing(12)
        address.addWidget(QLabel("Base URL"))
        address.addWidget(self.url_edit, 2)
        address.addWidget(self.copy_button)
        self.url_edit.setToolTip(
            'Point any OpenAI client at the base URL, e.g. OpenAI(base_url=URL, api_key="hearth").'
        )

        self.tabs = QTabWidget()
        self.tabs.setDocumentMode(True)
        self.tabs.addTab(self._activity(), "Activity")
        self.access_tab = self._access_and_cache()
        self.tabs.addTab(self.access_tab, "Access && cache")

        layout = QVBoxLayout(self)
        layout.setContentsMargins(*PAGE_MARGINS)
        layout.addLayout(header)
        layout.addWidget(self.banner)
        layout.addLayout(address)
        layout.addWidget(self.tabs, 1)

        self.start_button.clicked.connect(self._on_start_button_clicked)
        self.stop_button.clicked.connect(self._on_stop_button_clicked)
        self.copy_button.clicked.connect(self._on_copy_button_clicked)
        bridge.server_started.connect(self._on_bridge_server_started)
        bridge.server_stopped.connect(self._on_bridge_server_stopped)
        bridge.request_finished.connect(self._on_bridge_request_finished)
        self._show_state()

    def _activity(self) -> QSplitter:
        """The charts over the request log and the app's log (tabs), split so neither is drawn
        over the other; the charts scroll when the window is too short to show both whole."""
        charts = QWidget()
        # side by side where the page is wide, stacked (and scrolling) where it is narrow: each
        # chart draws two series next to each other, which need about 450 px to show whole
        self._charts_layout = QBoxLayout(QBoxLayout.Direction.LeftToRight, charts)
        self._charts_layout.setContentsMargins(0, 0, 0, 0)
        self.chart_titles = (QLabel("Generation speed"), QLabel("Prompt cache and batching"))
        for title, chart in (
            (self.chart_titles[0], self.speed_chart),
            (self.chart_titles[1], self.cache_chart),
        ):
            column = QVBoxLayout()
            column.addWidget(title)
            column.addWidget(chart)
            column.addStretch(1)
            self._charts_layout.addLayout(column, 1)
        self.charts_area = QScrollArea()
        self.charts_area.setWidget(charts)
        self.charts_area.setWidgetResizable(True)
        self.charts_area.setFrameShape(QScrollArea.Shape.NoFrame)
        self.charts_area.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.charts_area.setMinimumHeight(self.speed_chart.minimumHeight() + 24)
        self._arranged = False
        self.log_tail = LogTail(self._server.paths.logs, self._bridge)
        self.logs = QTabWidget()
        self.logs.addTab(self.request_log, "Requests")
        self.logs.addTab(self.log_tail, "App log")
        self.splitter = QSplitter(Qt.Orientation.Vertical)
        self.splitter.addWidget(self.charts_area)
        self.splitter.addWidget(self.logs)
        self.splitter.setChildrenCollapsible(False)
        self.splitter.setStretchFactor(0, 0)
        self.splitter.setStretchFactor(1, 1)
        return self.splitter

    @property
    def charts_side_by_side(self) -> bool:
        return self._charts_layout.direction() == QBoxLayout.Direction.LeftToRight

    def _arrange_charts(self) -> None:
        """Charts side by side when both fit at their width, else stacked; on a change the
        charts get the height of one row of charts and the logs the rest."""
        # the page's width, not the charts area's: the layout resizes that after this event
        left, _, right, _ = PAGE_MARGINS
        wide = self.width() - left - right >= 2 * CHART_MIN_WIDTH
        direction = QBoxLayout.Direction.LeftToRight if wide else QBoxLayout.Direction.TopToBottom
        if direction == self._charts_layout.direction() and self._arranged:
            return
        self._arranged = True
        self._charts_layout.setDirection(direction)
        one_row = self.chart_titles[0].sizeHint().height() + self.speed_chart.sizeHint().height()
        total = sum(self.splitter.sizes())
        self.splitter.setSizes([one_row + 12, max(total - one_row - 12, 1)])

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        self._arrange_charts()

    def _access_and_cache(self) -> QScrollArea:
        """API keys and the response cache: set up once, so they stay out of the watched area."""
        box = QWidget()
        bl = QVBoxLayout(box)
        self.keys_section = KeysSection(KeyStore(self._server.paths.keys_file), self._bridge)
        paths = self._server.paths
        self.cache_section = CacheSection(
            self._server.settings_store, paths.response_cache_db, self._bridge
        )
        bl.addWidget(self.keys_section, 1)
        bl.addWidget(self.cache_section)
        area = QScrollArea()
        area.setWidget(box)
        area.setWidgetResizable(True)
        area.setFrameShape(QScrollArea.Shape.NoFrame)
        return area

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
            copy_text(self.url_edit.text(), self.copy_button)
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
