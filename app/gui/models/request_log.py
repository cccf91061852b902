"""RequestLogModel: the server's last requests, newest first, capped."""

from __future__ import annotations

import time
from typing import Any

from PySide6.QtCore import QModelIndex, QPersistentModelIndex, Qt

from app.core.events import RequestFinished
from app.gui.models.base import RowTableModel

Index = QModelIndex | QPersistentModelIndex

COLUMNS: tuple[str, ...] = (
    "Time", "Method", "Path", "Status", "Model", "Tokens", "tok/s", "Note",
)  # fmt: skip
DEFAULT_CAP = 500
CPU_BUSY_NOTE = "CPU busy"
CPU_BUSY_TIP = "slower: the CPU is busy with other programs, so fewer decode threads were used"
_NUMERIC = {COLUMNS.index(c) for c in ("Status", "Tokens", "tok/s")}


class RequestLogModel(RowTableModel):
    """Fed by ``RequestFinished`` events; drops the oldest row past ``cap``."""

    columns = COLUMNS

    def __init__(self, cap: int = DEFAULT_CAP, parent: Any = None) -> None:
        super().__init__(parent)
        self.cap = cap
        self._rows: list[RequestFinished] = []

    def add(self, event: RequestFinished) -> None:
        self.beginInsertRows(QModelIndex(), 0, 0)
        self._rows.insert(0, event)
        self.endInsertRows()
        if len(self._rows) > self.cap:
            self.beginRemoveRows(QModelIndex(), self.cap, len(self._rows) - 1)
            del self._rows[self.cap :]
            self.endRemoveRows()

    def clear(self) -> None:
        self._replace_rows(())

    def event_at(self, row: int) -> RequestFinished:
        return self._rows[row]

    def data(self, index: Index, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if not index.isValid() or not 0 <= index.row() < len(self._rows):
            return None
        e = self._rows[index.row()]
        col = index.column()
        if role == Qt.ItemDataRole.DisplayRole:
            return self._display(e, col)
        if role == Qt.ItemDataRole.ToolTipRole:
            tip = f"{e.method} {e.path} -> {e.status} in {e.seconds:.3f}s"
            if e.prompt_tokens_per_second > 0:
                tip += f"; prompt {e.prompt_tokens_per_second:,.1f} tok/s"
            if e.batch_size > 0:
                tip += f"; batch {e.batch_size:.1f}"
            if e.cpu_busy:
                tip += f"; {CPU_BUSY_TIP}"
            return tip
        if role == Qt.ItemDataRole.TextAlignmentRole and col in _NUMERIC:
            return int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        return None

    @staticmethod
    def _display(e: RequestFinished, col: int) -> str:
        values = (
            time.strftime("%H:%M:%S", time.localtime(e.at)),
            e.method,
            e.path,
            str(e.status),
            e.model or "",
            tokens_text(e),
            f"{e.tokens_per_second:.1f}" if e.tokens_per_second > 0 else "",
            CPU_BUSY_NOTE if e.cpu_busy else "",
        )
        return values[col]


def tokens_text(e: RequestFinished) -> str:
    """``"1,200 in (1,024 cached) / 24 out"``; empty for a request without tokens."""
    if not (e.prompt_tokens or e.completion_tokens):
        return ""
    cached = f" ({e.cached_tokens:,} cached)" if e.cached_tokens else ""
    return f"{e.prompt_tokens:,} in{cached} / {e.completion_tokens:,} out"
