"""RequestLogModel: the server's request records (app/core/gateway/records.py), newest first, capped.

Rows are ``(id, RequestRecord)`` read from the records database (so the log survives a
restart); the live ``RequestFinished`` events add what records do not keep (a busy CPU, prompt
speed, batch size), paired with their record by arrival time, method and status."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

from PySide6.QtCore import QModelIndex, QPersistentModelIndex, Qt

from app.core.events import RequestFinished
from app.core.gateway.records import RequestRecord, iso_utc
from app.gui.models.base import RowTableModel

Index = QModelIndex | QPersistentModelIndex
Row = tuple[int, RequestRecord]  # the record's id in the database, the record
LiveKey = tuple[float, str, int]  # arrival (wall clock), method, status

COLUMNS: tuple[str, ...] = (
    "Time", "Method", "Route", "Status", "Model", "Key", "TTFT ms", "Total ms", "tok/s",
    "Tokens", "Cache", "Note",
)  # fmt: skip
DEFAULT_CAP = 500
CPU_BUSY_NOTE = "CPU busy"
CPU_BUSY_TIP = "slower: the CPU is busy with other programs, so fewer decode threads were used"
_NUMERIC = {COLUMNS.index(c) for c in ("Status", "TTFT ms", "Total ms", "tok/s", "Tokens")}


def live_key(event: RequestFinished) -> LiveKey:
    return (event.arrived_at, event.method, event.status)


def record_key(r: RequestRecord) -> LiveKey:
    return (r.time, r.method, r.status)


class RequestLogModel(RowTableModel):
    """Records newest first, at most ``cap``; :meth:`prepend` adds newer ones (by id, so a
    record is never shown twice), :meth:`reset` replaces them all (a new filter)."""

    columns = COLUMNS

    def __init__(self, cap: int = DEFAULT_CAP, parent: Any = None) -> None:
        super().__init__(parent)
        self.cap = cap
        self._rows: list[Row] = []
        # the live events' extras by their record's key: bounded like the rows
        self._live: OrderedDict[LiveKey, RequestFinished] = OrderedDict()

    # -- rows ---------------------------------------------------------------------------------
    def reset(self, rows: Iterable[Row]) -> None:
        self._replace_rows(list(rows)[: self.cap])

    def prepend(self, rows: Iterable[Row]) -> int:
        """Add records newer than every row shown (newest first); returns how many."""
        top = self.newest_id()
        new = [r for r in rows if top is None or r[0] > top][: self.cap]
        if not new:
            return 0
        new.sort(key=lambda r: r[0], reverse=True)
        self.beginInsertRows(QModelIndex(), 0, len(new) - 1)
        self._rows[:0] = new
        self.endInsertRows()
        if len(self._rows) > self.cap:
            self.beginRemoveRows(QModelIndex(), self.cap, len(self._rows) - 1)
            del self._rows[self.cap :]
            self.endRemoveRows()
        return len(new)

    def newest_id(self) -> int | None:
        return self._rows[0][0] if self._rows else None

    def ids(self) -> list[int]:
        return [i for i, _ in self._rows]

    def record_at(self, row: int) -> RequestRecord:
        return self._rows[row][1]

    def clear(self) -> None:
        self._replace_rows(())

    # -- live extras ----------------------------------------------------------------------------
    def note_live(self, event: RequestFinished) -> None:
        """Keep an event's extras for its record (which may be shown already, or come later)."""
        key = live_key(event)
        self._live[key] = event
        self._live.move_to_end(key)
        while len(self._live) > self.cap:
            self._live.popitem(last=False)
        for i, (_, r) in enumerate(self._rows):
            if record_key(r) == key:
                self.dataChanged.emit(self.index(i, 0), self.index(i, len(COLUMNS) - 1))
                break

    def live_for(self, r: RequestRecord) -> RequestFinished | None:
        return self._live.get(record_key(r))

    # -- Qt --------------------------------------------------------------------------------------
    def data(self, index: Index, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if not index.isValid() or not 0 <= index.row() < len(self._rows):
            return None
        r = self._rows[index.row()][1]
        col = index.column()
        if role == Qt.ItemDataRole.DisplayRole:
            return display(r, self.live_for(r))[col]
        if role == Qt.ItemDataRole.ToolTipRole:
            return tooltip(r, self.live_for(r))
        if role == Qt.ItemDataRole.TextAlignmentRole and col in _NUMERIC:
            return int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        return None


def when_text(t: float, now: float | None = None) -> str:
    """``HH:MM:SS`` today, ``YYYY-MM-DD HH:MM`` before (local time)."""
    day = time.localtime(now if now is not None else time.time())[:3]
    local = time.localtime(t)
    return time.strftime("%H:%M:%S" if local[:3] == day else "%Y-%m-%d %H:%M", local)


def model_text(r: RequestRecord) -> str:
    """The model asked for, with ``→ answered_by`` when another answered (an alias, auto)."""
    if r.answered_by and r.model and r.answered_by != r.model:
        return f"{r.model} → {r.answered_by}"
    return r.answered_by or r.model or ""


def tokens_text(r: RequestRecord | RequestFinished) -> str:
    """``"1,200 in (1,024 cached) / 24 out"``; empty for a request without tokens."""
    if not (r.prompt_tokens or r.completion_tokens):
        return ""
    cached = f" ({r.cached_tokens:,} cached)" if r.cached_tokens else ""
    return f"{r.prompt_tokens:,} in{cached} / {r.completion_tokens:,} out"


def _ms(v: float | None) -> str:
    return "" if v is None else f"{v:,.0f}"


def display(r: RequestRecord, live: RequestFinished | None) -> tuple[str, ...]:
    notes = [r.error_code or "", CPU_BUSY_NOTE if live is not None and live.cpu_busy else ""]
    return (
        when_text(r.time),
        r.method,
        r.route,
        str(r.status),
        model_text(r),
        r.key or "",
        _ms(r.ttft_ms),
        _ms(r.total_ms),
        f"{r.tokens_per_second:.1f}" if r.tokens_per_second else "",
        tokens_text(r),
        r.cache or "",
        "; ".join(n for n in notes if n),
    )


def tooltip(r: RequestRecord, live: RequestFinished | None) -> str:
    tip = f"{r.method} {r.route} -> {r.status} in {r.total_ms / 1000:.3f}s at {iso_utc(r.time)}"
    if live is not None and live.prompt_tokens_per_second > 0:
        tip += f"; prompt {live.prompt_tokens_per_second:,.1f} tok/s"
    if live is not None and live.batch_size > 0:
        tip += f"; batch {live.batch_size:.1f}"
    if live is not None and live.cpu_busy:
        tip += f"; {CPU_BUSY_TIP}"
    return tip + " (Enter or double-click: every field)"
