"""The Downloads page: the Hub download queue with progress, and Pause / Resume / Cancel / Retry
for the selected download. Every call goes to the DownloadManager on the service loop."""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine
from typing import Any

from PySide6.QtCore import QModelIndex, QPersistentModelIndex, Signal
from PySide6.QtGui import QPainter
from PySide6.QtWidgets import (
    QAbstractItemView,
    QApplication,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QPushButton,
    QStyle,
    QStyledItemDelegate,
    QStyleOptionProgressBar,
    QStyleOptionViewItem,
    QTableView,
    QVBoxLayout,
    QWidget,
)

from app.core import events as ev
from app.core.hub.downloads import DownloadManager, DownloadStatus
from app.core.service import Hearth
from app.gui.bridge import Bridge, log_failure
from app.gui.models.download import (
    ACTIVE_STATES,
    PERCENT_ROLE,
    PROGRESS_COLUMN,
    DownloadsTableModel,
)
from app.gui.views.common import PAGE_MARGINS, MessageBanner, page_title

log = logging.getLogger(__name__)

TITLE = "Downloads"
UNAVAILABLE_TEXT = "Downloads from the Hugging Face Hub are not available in this session."


class ProgressDelegate(QStyledItemDelegate):
    """Draws the Progress column as a progress bar."""

    def paint(
        self,
        painter: QPainter,
        option: QStyleOptionViewItem,
        index: QModelIndex | QPersistentModelIndex,
    ) -> None:
        value = index.data(PERCENT_ROLE)
        if not isinstance(value, int):
            super().paint(painter, option, index)
            return
        bar = QStyleOptionProgressBar()
        bar.rect = option.rect.adjusted(2, 3, -2, -3)  # type: ignore[attr-defined]
        bar.minimum = 0
        bar.maximum = 100
        bar.progress = value
        bar.text = f"{value}%"
        bar.textVisible = True
        style = QApplication.style()
        style.drawControl(QStyle.ControlElement.CE_ProgressBar, bar, painter)


class DownloadsPage(QWidget):
    """Lists downloads; acts on the selected one."""

    refreshed = Signal()  # the table shows a fresh list from the manager
    download_finished = Signal(str, str)  # download id, model id

    def __init__(self, service: Hearth, bridge: Bridge, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._service = service
        self._bridge = bridge
        self.table_model = DownloadsTableModel(self)

        self.pause_button = QPushButton("Pause")
        self.resume_button = QPushButton("Resume")
        self.cancel_button = QPushButton("Cancel")
        self.retry_button = QPushButton("Retry")
        self.clear_button = QPushButton("Clear finished")
        header = QHBoxLayout()
        header.addWidget(page_title(TITLE))
        header.addStretch(1)
        for b in (
            self.pause_button,
            self.resume_button,
            self.cancel_button,
            self.retry_button,
            self.clear_button,
        ):
            header.addWidget(b)

        self.banner = MessageBanner()
        self.table = QTableView()
        self.table.setModel(self.table_model)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.setAlternatingRowColors(True)
        self.table.verticalHeader().hide()
        self.table.setWordWrap(False)
        self.table.setShowGrid(False)
        self.table.setItemDelegateForColumn(PROGRESS_COLUMN, ProgressDelegate(self.table))
        hh = self.table.horizontalHeader()
        hh.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        hh.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        hh.setSectionResizeMode(PROGRESS_COLUMN, QHeaderView.ResizeMode.Fixed)
        hh.resizeSection(PROGRESS_COLUMN, 160)
        self.empty_label = QLabel("No downloads yet. Find models on the Discover page.")

        layout = QVBoxLayout(self)
        layout.setContentsMargins(*PAGE_MARGINS)
        layout.addLayout(header)
        layout.addWidget(self.banner)
        layout.addWidget(self.empty_label)
        layout.addWidget(self.table, 1)

        self.pause_button.clicked.connect(self._on_pause_button_clicked)
        self.resume_button.clicked.connect(self._on_resume_button_clicked)
        self.cancel_button.clicked.connect(self._on_cancel_button_clicked)
        self.retry_button.clicked.connect(self._on_retry_button_clicked)
        self.clear_button.clicked.connect(self._on_clear_button_clicked)
        self.table.selectionModel().selectionChanged.connect(self._on_selection_changed)
        self.table_model.dataChanged.connect(self._on_model_changed)
        self.table_model.rowsInserted.connect(self._on_model_changed)
        self.table_model.modelReset.connect(self._on_model_changed)
        bridge.download_changed.connect(self._on_bridge_download_changed)

        if self.manager is None:
            self.banner.show_message(UNAVAILABLE_TEXT, "notice")
        self._update_buttons()
        self.refresh()

    # -- public --------------------------------------------------------------------------------------
    @property
    def manager(self) -> DownloadManager | None:
        return self._service.hub

    def refresh(self) -> None:
        dm = self.manager
        if dm is None:
            return
        self._bridge.call(dm.list, on_done=self._on_list_done, on_error=self._on_action_failed)

    def active(self) -> list[DownloadStatus]:
        """Downloads in progress or waiting."""
        return [s for s in self.table_model.statuses() if s.state in ACTIVE_STATES]

    def unfinished(self) -> list[DownloadStatus]:
        """Downloads not completed, failed or cancelled, paused ones included (the tray lists
        these)."""
        return [s for s in self.table_model.statuses() if not s.finished]

    def selected_id(self) -> str | None:
        rows = self.table.selectionModel().selectedRows()
        if not rows:
            return None
        return self.table_model.status(rows[0].row()).id

    def select(self, download_id: str) -> None:
        row = self.table_model.row_of(download_id)
        if row >= 0:
            self.table.selectRow(row)

    def pause(self, download_id: str) -> None:
        self._act(download_id, lambda dm: dm.pause(download_id))

    def resume(self, download_id: str) -> None:
        self._act(download_id, lambda dm: dm.resume(download_id))

    def cancel(self, download_id: str) -> None:
        self._act(download_id, lambda dm: dm.cancel(download_id))

    def retry(self, download_id: str) -> None:
        self._act(download_id, lambda dm: dm.retry(download_id))

    # -- slots ---------------------------------------------------------------------------------------
    def _on_pause_button_clicked(self) -> None:
        if (d := self.selected_id()) is not None:
            self.pause(d)

    def _on_resume_button_clicked(self) -> None:
        if (d := self.selected_id()) is not None:
            self.resume(d)

    def _on_cancel_button_clicked(self) -> None:
        if (d := self.selected_id()) is not None:
            self.cancel(d)

    def _on_retry_button_clicked(self) -> None:
        if (d := self.selected_id()) is not None:
            self.retry(d)

    def _on_clear_button_clicked(self) -> None:
        dm = self.manager
        if dm is not None:
            self._bridge.call(dm.clear_finished, on_done=lambda _: self.refresh())

    def _on_selection_changed(self, *_: object) -> None:
        self._update_buttons()

    def _on_model_changed(self, *_: object) -> None:
        self.empty_label.setVisible(self.table_model.rowCount() == 0)
        self._update_buttons()

    def _on_bridge_download_changed(self, event: ev.Event) -> None:
        if isinstance(event, ev.DownloadQueued) or not self.table_model.apply(event):
            self._fetch(event.download_id)  # type: ignore[attr-defined]
        if isinstance(event, ev.DownloadFinished):
            self.download_finished.emit(event.download_id, event.model_id)

    def _on_list_done(self, statuses: list[DownloadStatus]) -> None:
        selected = self.selected_id()
        self.table_model.set_statuses(statuses)
        if selected is not None:
            self.select(selected)
        self.refreshed.emit()

    def _on_status_done(self, status: DownloadStatus) -> None:
        self.table_model.upsert(status)

    def _on_action_failed(self, exc: BaseException) -> None:
        self.banner.show_message(log_failure(log, "download action", exc), "error")

    # -- helpers -------------------------------------------------------------------------------------
    def _fetch(self, download_id: str) -> None:
        dm = self.manager
        if dm is None:
            return
        self._bridge.call(
            dm.get, download_id, on_done=self._on_status_done, on_error=self._on_action_failed
        )

    def _act(
        self,
        download_id: str,
        make: Callable[[DownloadManager], Coroutine[Any, Any, DownloadStatus]],
    ) -> None:
        dm = self.manager
        if dm is None:
            return
        self.banner.clear_message()
        self._bridge.run(make(dm), on_done=self._on_status_done, on_error=self._on_action_failed)

    def _update_buttons(self) -> None:
        d = self.selected_id()
        state = self.table_model.state_of(d) if d is not None else None
        self.pause_button.setEnabled(state in ACTIVE_STATES)
        self.resume_button.setEnabled(state == "paused")
        self.cancel_button.setEnabled(state is not None and state not in ("completed", "cancelled"))
        self.retry_button.setEnabled(state in ("failed", "cancelled"))
        self.clear_button.setEnabled(any(s.finished for s in self.table_model.statuses()))
