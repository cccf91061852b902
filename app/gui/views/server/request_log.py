"""The Server page's request log: the request records database, newest first, with
filters (model, status code or class, route text), a TTFT column, and every field of a record
(and its content, when ``records.log_content`` kept it) on Enter or a double-click.

Reads run in a worker thread (``asyncio.to_thread`` through the bridge): neither the GUI nor
the service loop waits for SQLite. The log polls with the newest id it shows, and re-reads at
once when a request finishes (its record is committed a moment after the event: it re-reads
until it is there), so a request is never missed nor shown twice; records written by another
Hearth process sharing the data folder (``hearth serve``) appear too."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import fields
from pathlib import Path
from typing import Any

from PySide6.QtCore import QModelIndex, Qt, QTimer, Signal
from PySide6.QtGui import QPalette, QShowEvent
from PySide6.QtWidgets import (
    QAbstractItemView,
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QTableView,
    QVBoxLayout,
    QWidget,
)

from app.core.events import RequestFinished
from app.core.gateway.records import RequestRecord, iso_utc, query_records, status_range
from app.gui.bridge import Bridge, error_text
from app.gui.models.request_log import (
    COLUMNS,
    DEFAULT_CAP,
    LiveKey,
    RequestLogModel,
    Row,
    live_key,
    record_key,
)

log = logging.getLogger(__name__)

POLL_MS = 2000  # while shown: records from elsewhere (a headless server), cancelled streams
RETRY_MS = 100  # a finished request's record is not there yet: read again this soon
MAX_RETRIES = 50  # ... this many times at most (then the poll still finds it)
FILTER_DELAY_MS = 250  # typing in a filter re-reads once the typing pauses

_COLUMN_SAMPLES = (
    "0000-00-00 00:00",
    "OPTIONS",
    "/v1/chat/completions",
    "Status",
    "smollm2-135m-instruct.q4_1",
    "key-name",
    "TTFT ms",
    "Total ms",
    "tok/s 00",
    "12,345 in (12,288 cached) / 1,234 out",
    "semantic",
    "rate_limit_exceeded",
)


class RequestLogView(QWidget):
    """Filters over the records table; ``queried`` is emitted each time a read's rows are in."""

    queried = Signal()

    def __init__(
        self,
        db_path: Path,
        bridge: Bridge,
        parent: QWidget | None = None,
        *,
        cap: int = DEFAULT_CAP,
    ) -> None:
        super().__init__(parent)
        self.db_path = db_path
        self._bridge = bridge
        self.model = RequestLogModel(cap, self)
        self.detail: RecordDialog | None = None
        self.queries = 0  # reads finished (tests wait on this)
        self._generation = 0  # bumped by each filter change: answers to older reads are dropped
        self._in_flight = False
        self._again = False  # a read was asked for while one ran: run it after
        self._full = True  # the next read replaces every row (the first one, a new filter)
        self._waiting: dict[LiveKey, int] = {}  # finished requests not read yet -> retries

        self.model_edit = QLineEdit()
        self.model_edit.setPlaceholderText("model id (asked for or answering)")
        self.status_edit = QLineEdit()
        self.status_edit.setPlaceholderText("status: 429 or 4xx")
        self.status_edit.setMaximumWidth(160)
        self.route_edit = QLineEdit()
        self.route_edit.setPlaceholderText("route contains")
        self.summary = QLabel()
        self.summary.setForegroundRole(QPalette.ColorRole.PlaceholderText)
        self.table = QTableView()
        self.table.setModel(self.model)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setAlternatingRowColors(True)
        self.table.verticalHeader().hide()
        self.table.setWordWrap(False)
        # fixed widths from sample text: measuring 500 rows on every request would cost more
        # than the log is worth, and the header does not re-measure on row inserts anyway
        hh = self.table.horizontalHeader()
        hh.setSectionResizeMode(QHeaderView.ResizeMode.Interactive)
        fm = self.table.fontMetrics()
        for col, sample in enumerate(_COLUMN_SAMPLES):
            hh.resizeSection(col, fm.horizontalAdvance(sample) + 24)
        hh.setSectionResizeMode(COLUMNS.index("Route"), QHeaderView.ResizeMode.Stretch)

        filters = QHBoxLayout()
        filters.addWidget(QLabel("Recent requests"))
        filters.addStretch(1)
        filters.addWidget(self.model_edit, 2)
        filters.addWidget(self.status_edit, 1)
        filters.addWidget(self.route_edit, 1)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addLayout(filters)
        layout.addWidget(self.table, 1)
        layout.addWidget(self.summary)

        self.retry_timer = QTimer(self)
        self.retry_timer.setSingleShot(True)
        self.retry_timer.setInterval(RETRY_MS)
        self.retry_timer.timeout.connect(self.refresh)
        self.poll_timer = QTimer(self)
        self.poll_timer.setInterval(POLL_MS)
        self.poll_timer.timeout.connect(self._on_poll_timer_timeout)
        self.poll_timer.start()
        self.filter_timer = QTimer(self)
        self.filter_timer.setSingleShot(True)
        self.filter_timer.setInterval(FILTER_DELAY_MS)
        self.filter_timer.timeout.connect(self.apply_filters)
        for edit in (self.model_edit, self.status_edit, self.route_edit):
            edit.textChanged.connect(self._on_filter_text_changed)
        self.table.activated.connect(self._on_table_activated)
        bridge.request_finished.connect(self._on_bridge_request_finished)
        self.refresh()

    # -- reading ---------------------------------------------------------------------------------
    def filters(self) -> dict[str, Any]:
        """The filter fields as ``query_records`` arguments.

        Raises:
            ValueError: the status is neither a code nor a class.
        """
        status = self.status_edit.text().strip()
        return {
            "model": self.model_edit.text().strip() or None,
            "status": status_range(status) if status else None,
            "route": self.route_edit.text().strip() or None,
        }

    def apply_filters(self) -> None:
        """Re-read every row with the filters as they are now."""
        self.filter_timer.stop()
        self._generation += 1
        self._full = True
        self.refresh()

    def refresh(self) -> None:
        """Read what is new (every row after a filter change), in a worker thread."""
        if self._in_flight:
            self._again = True
            return
        try:
            where = self.filters()
        except ValueError as e:
            self.summary.setText(str(e))
            return
        full = self._full or self.model.newest_id() is None
        after = None if full else self.model.newest_id()
        gen = self._generation
        self._in_flight = True
        read = asyncio.to_thread(
            query_records, self.db_path, limit=self.model.cap, after_id=after, **where
        )
        self._bridge.run(
            read,
            on_done=lambda rows: self._on_read_done(gen, full, rows),
            on_error=self._on_read_failed,
        )

    def _on_read_done(self, gen: int, full: bool, rows: list[Row]) -> None:
        self._in_flight = False
        if gen != self._generation:  # the filters changed meanwhile: read again with them
            self.refresh()
            return
        if full:
            self._full = False
            self.model.reset(rows)
        else:
            self.model.prepend(rows)
        self._settle_waiting()
        self.queries += 1
        self._show_summary()
        self.queried.emit()
        if self._again:
            self._again = False
            self.refresh()

    def _on_read_failed(self, exc: BaseException) -> None:
        self._in_flight = False
        log.warning("could not read the request records at %s: %s", self.db_path, exc)
        self.summary.setText(f"Could not read the request records: {error_text(exc)}")
        if self._again:
            self._again = False
            self.refresh()

    def _settle_waiting(self) -> None:
        """Forget the finished requests now shown; read again soon for the others."""
        if not self._waiting:
            return
        shown = {record_key(self.model.record_at(i)) for i in range(self.model.rowCount())}
        for key in list(self._waiting):
            self._waiting[key] += 1
            if key in shown or self._waiting[key] > MAX_RETRIES:
                del self._waiting[key]  # a filtered-out one stops here; the poll remains
        if self._waiting:
            self.retry_timer.start()

    def _show_summary(self) -> None:
        n = self.model.rowCount()
        filtered = any(
            e.text().strip() for e in (self.model_edit, self.status_edit, self.route_edit)
        )
        if n == 0:
            self.summary.setText("No request matches." if filtered else "No requests recorded yet.")
            return
        more = f" (the newest {n})" if n >= self.model.cap else ""
        what = "matching requests" if filtered else "requests"
        self.summary.setText(
            f"{n} {what}{more}, newest first. Enter or double-click a row for every field."
        )

    # -- detail ----------------------------------------------------------------------------------
    def open_detail(self, row: int) -> RecordDialog:
        """A dialog with every field of the row's record (and its content, when kept)."""
        if self.detail is not None:
            self.detail.close()
        record = self.model.record_at(row)
        self.detail = RecordDialog(record, self.model.live_for(record), self)
        self.detail.show()
        return self.detail

    # -- slots -----------------------------------------------------------------------------------
    def _on_bridge_request_finished(self, event: RequestFinished) -> None:
        self.model.note_live(event)
        if event.arrived_at:
            self._waiting[live_key(event)] = 0
        self.refresh()

    def _on_filter_text_changed(self, _text: str) -> None:
        self.filter_timer.start()

    def _on_poll_timer_timeout(self) -> None:
        if self.isVisible():
            self.refresh()

    def _on_table_activated(self, index: QModelIndex) -> None:
        if index.isValid():
            self.open_detail(index.row())

    def showEvent(self, e: QShowEvent) -> None:  # noqa: N802 - Qt override
        super().showEvent(e)
        self.refresh()


def field_text(name: str, value: Any) -> str:
    """One field as the detail dialog shows it."""
    if value is None:
        return "—"
    if name == "time":
        return f"{iso_utc(value)} ({time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(value))})"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:,.1f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


CONTENT_OFF = "Not recorded (turn on records.log_content in settings.json to keep content)."


class RecordDialog(QDialog):
    """Every field of one record; ``values`` maps each field's name to its label."""

    def __init__(
        self, record: RequestRecord, live: RequestFinished | None, parent: QWidget | None = None
    ) -> None:
        super().__init__(parent)
        self.setWindowTitle(f"{record.method} {record.route} → {record.status}")
        self.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        self.record = record
        self.values: dict[str, QLabel] = {}
        form = QFormLayout()
        for f in fields(record):
            if f.name in ("request_text", "response_text"):
                continue
            label = QLabel(field_text(f.name, getattr(record, f.name)))
            label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
            self.values[f.name] = label
            form.addRow(f.name, label)
        if live is not None:  # what the live event said that records do not keep
            extras = {
                "prompt_tokens_per_second": live.prompt_tokens_per_second or None,
                "batch_size": live.batch_size or None,
                "cpu_busy": live.cpu_busy,
            }
            for name, value in extras.items():
                label = QLabel(field_text(name, value))
                self.values[name] = label
                form.addRow(name, label)
        kept = record.request_text is not None or record.response_text is not None
        self.request_text = self._content(record.request_text, kept)
        self.response_text = self._content(record.response_text, kept)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.close)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(QLabel("Request body"))
        layout.addWidget(self.request_text, 1)
        layout.addWidget(QLabel("Response text"))
        layout.addWidget(self.response_text, 1)
        layout.addWidget(buttons)
        self.resize(640, 760)

    @staticmethod
    def _content(text: str | None, kept: bool) -> QPlainTextEdit:
        box = QPlainTextEdit(text if text is not None else "(none)" if kept else CONTENT_OFF)
        box.setReadOnly(True)
        return box
