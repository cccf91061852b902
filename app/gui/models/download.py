"""DownloadsTableModel: the DownloadManager's queue, one row per download, kept current from the
core's Download* events (never by polling files).
Tested by tests/gui/views/test_downloads.py."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from PySide6.QtCore import QModelIndex, QPersistentModelIndex, Qt

from app.core import events as ev
from app.core.hub.downloads import DownloadStatus
from app.gui.models.base import RowTableModel
from app.gui.models.memory import countdown
from app.gui.units import human_bytes

Index = QModelIndex | QPersistentModelIndex

COLUMNS: tuple[str, ...] = ("File", "Repository", "Progress", "Size", "Speed", "ETA", "State")
PROGRESS_COLUMN = COLUMNS.index("Progress")
STATE_COLUMN = COLUMNS.index("State")
ID_ROLE = Qt.ItemDataRole.UserRole
PERCENT_ROLE = Qt.ItemDataRole.UserRole + 1
STATE_TEXT = {
    "queued": "Queued",
    "downloading": "Downloading",
    "stalled": "Stalled",
    "retrying": "Retrying",
    "verifying": "Verifying",
    "paused": "Paused",
    "completed": "Done",
    "failed": "Failed",
    "cancelled": "Cancelled",
}
ACTIVE_STATES = frozenset({"queued", "downloading", "stalled", "retrying", "verifying"})


def percent(s: DownloadStatus) -> int:
    if s.total_bytes <= 0:
        return 100 if s.state == "completed" else 0
    return max(0, min(100, int(s.bytes_done * 100 / s.total_bytes)))


def speed_text(bps: float) -> str:
    return f"{human_bytes(int(bps))}/s" if bps > 0 else ""


class DownloadsTableModel(RowTableModel):
    """Rows are ``DownloadStatus`` snapshots; events patch them in place."""

    columns = COLUMNS

    # -- content -------------------------------------------------------------------------------
    def set_statuses(self, statuses: Sequence[DownloadStatus]) -> None:
        self._replace_rows(statuses)

    def upsert(self, status: DownloadStatus) -> None:
        row = self.row_of(status.id)
        if row < 0:
            self.beginInsertRows(QModelIndex(), len(self._rows), len(self._rows))
            self._rows.append(status)
            self.endInsertRows()
        else:
            self._rows[row] = status
            self._changed(row)

    def apply(self, event: ev.Event) -> bool:
        """Patch the row an event is about; False when the row is unknown (fetch it)."""
        download_id = getattr(event, "download_id", None)
        row = self.row_of(download_id) if isinstance(download_id, str) else -1
        if row < 0:
            return False
        s = self._rows[row]
        if isinstance(event, ev.DownloadProgressed):
            s = replace(
                s,
                state=event.state,
                bytes_done=event.bytes_done,
                total_bytes=event.total_bytes or s.total_bytes,
                speed_bps=event.speed_bps,
                eta_s=event.eta_s,
                current_file=event.file or s.current_file,
            )
        elif isinstance(event, ev.DownloadPaused):
            s = replace(s, state="paused", bytes_done=event.bytes_done, speed_bps=0.0, eta_s=None)
        elif isinstance(event, ev.DownloadFinished):
            s = replace(s, state="completed", model_id=event.model_id, bytes_done=s.total_bytes)
        elif isinstance(event, ev.DownloadFailed):
            s = replace(s, state="failed", error=event.message, error_code=event.code)
        elif isinstance(event, ev.DownloadCancelled):
            s = replace(s, state="cancelled", speed_bps=0.0, eta_s=None)
        self._rows[row] = s
        self._changed(row)
        return True

    def status(self, row: int) -> DownloadStatus:
        return self._rows[row]

    def statuses(self) -> list[DownloadStatus]:
        return list(self._rows)

    def row_of(self, download_id: str) -> int:
        return next((i for i, s in enumerate(self._rows) if s.id == download_id), -1)

    def ids(self) -> list[str]:
        return [s.id for s in self._rows]

    def state_of(self, download_id: str) -> str | None:
        row = self.row_of(download_id)
        return self._rows[row].state if row >= 0 else None

    def _changed(self, row: int) -> None:
        self.dataChanged.emit(self.index(row, 0), self.index(row, len(COLUMNS) - 1))

    # -- QAbstractTableModel --------------------------------------------------------------------
    def data(self, index: Index, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if not index.isValid() or not 0 <= index.row() < len(self._rows):
            return None
        s = self._rows[index.row()]
        col = index.column()
        if role == Qt.ItemDataRole.DisplayRole:
            return self._display(s, col)
        if role == ID_ROLE:
            return s.id
        if role == PERCENT_ROLE:
            return percent(s)
        if role == Qt.ItemDataRole.ToolTipRole:
            lines = [f"{s.repo_id} ({s.option})", *s.files]
            if s.error:
                lines.append(s.error)
            return "\n".join(lines)
        return None

    @staticmethod
    def _display(s: DownloadStatus, col: int) -> str:
        name = COLUMNS[col]
        if name == "File":
            return s.name
        if name == "Repository":
            return s.repo_id
        if name == "Progress":
            return f"{percent(s)}%"
        if name == "Size":
            return f"{human_bytes(s.bytes_done)} of {human_bytes(s.total_bytes)}"
        if name == "Speed":
            return speed_text(s.speed_bps) if s.state == "downloading" else ""
        if name == "ETA":
            if s.state == "downloading" and s.eta_s is not None:
                return countdown(s.eta_s)
            return ""
        text = STATE_TEXT.get(s.state, s.state.capitalize())
        if s.state == "failed" and s.error:
            text = f"Failed: {s.error}"
        return text
