"""What is in memory: a cached snapshot of the loaded models and the budget (MemoryMonitor), and
the table model that shows it with a keep-alive countdown (LoadedModelsTableModel)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from PySide6.QtCore import (
    QModelIndex,
    QObject,
    QPersistentModelIndex,
    Qt,
    QTimer,
    Signal,
)
from PySide6.QtGui import QColor

from app.core.engine.loaded import LoadedInfo
from app.core.engine.models import ModelService
from app.core.service import Hearth
from app.gui.bridge import Bridge, log_failure
from app.gui.models.base import RowTableModel
from app.gui.units import grouped, human_bytes

log = logging.getLogger(__name__)

Index = QModelIndex | QPersistentModelIndex

POLL_MS = 3000  # refetch this often besides on load/unload events: TTLs and busy states drift


@dataclass(frozen=True)
class MemorySnapshot:
    """The scheduler's state at one moment (read on the loop thread)."""

    models: tuple[LoadedInfo, ...] = ()
    used: int = 0
    budget: int = 0
    loading: tuple[str, ...] = ()

    def find(self, model_id: str) -> LoadedInfo | None:
        return next((m for m in self.models if m.model_id == model_id), None)


def take_snapshot(models: ModelService) -> MemorySnapshot:
    """Loop thread only: the scheduler's state lives there."""
    loaded = sorted(models.loaded(), key=lambda m: m.loaded_at)
    memory = models.memory()
    return MemorySnapshot(tuple(loaded), memory["used"], memory["budget"], tuple(models.loading()))


def countdown(seconds: float) -> str:
    """``272`` -> ``"4:32"``; hours when needed (``"1:02:03"``)."""
    s = max(0, int(seconds + 0.999))  # round up: "0:00" only once it is due
    h, rest = divmod(s, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def keep_alive_text(info: LoadedInfo, now: float) -> str:
    """What the Keep-alive column says: Pinned, Never, Busy, or "Unloads in m:ss"."""
    if info.pinned:
        return "Pinned"
    if info.ttl is None:
        return "Never"
    if info.pending > 0 or info.expires_at is None:
        return "Busy"  # the countdown starts again when the last request ends
    left = info.expires_at - now
    return f"Unloads in {countdown(left)}" if left > 0 else "Unloading…"


def ttl_text(ttl: float | None) -> str:
    """A keep-alive setting in words: ``None`` -> "never", ``900`` -> "15 min idle"."""
    if ttl is None:
        return "never"
    if ttl == 0:
        return "as soon as idle"
    if ttl % 60 == 0:
        return f"{int(ttl // 60)} min idle"
    return f"{ttl:g} s idle"


class MemoryMonitor(QObject):
    """Keeps ``snapshot`` fresh: refetched on every load/unload event, after server requests, and
    every ``poll_ms``. Never blocks the GUI thread; views read the cached snapshot."""

    refreshed = Signal(object)  # MemorySnapshot

    def __init__(
        self,
        service: Hearth,
        bridge: Bridge,
        parent: QObject | None = None,
        *,
        poll_ms: int = POLL_MS,
    ) -> None:
        super().__init__(parent)
        self._service = service
        self._bridge = bridge
        self._in_flight = False
        self._again = False
        self.snapshot = MemorySnapshot()
        self.fetched = False  # a first snapshot has arrived
        self.poll_timer = QTimer(self)
        self.poll_timer.setInterval(poll_ms)
        self.poll_timer.timeout.connect(self._on_poll_timer_timeout)
        self.poll_timer.start()
        for sig in (
            bridge.model_loading,
            bridge.model_loaded,
            bridge.model_unloaded,
            bridge.model_load_failed,
            bridge.request_finished,
        ):
            sig.connect(self._on_bridge_state_changed)
        self.refresh()

    def refresh(self) -> None:
        """Fetch a new snapshot; a call while one is in flight fetches once more afterwards."""
        if self._in_flight:
            self._again = True
            return
        self._in_flight = True
        self._bridge.call(
            take_snapshot,
            self._service.models,
            on_done=self._on_snapshot_taken,
            on_error=self._on_snapshot_failed,
        )

    def _on_poll_timer_timeout(self) -> None:
        self.refresh()

    def _on_bridge_state_changed(self, *_: object) -> None:
        self.refresh()

    def _on_snapshot_taken(self, snapshot: MemorySnapshot) -> None:
        self._in_flight = False
        self.snapshot = snapshot
        self.fetched = True
        self.refreshed.emit(snapshot)
        self._refetch_if_asked()

    def _on_snapshot_failed(self, exc: BaseException) -> None:
        self._in_flight = False
        log_failure(log, "reading the loaded models failed", exc)
        self._refetch_if_asked()

    def _refetch_if_asked(self) -> None:
        if self._again:
            self._again = False
            self.refresh()


COLUMNS: tuple[str, ...] = (
    "Model",
    "Runtime",
    "Context",
    "Memory",
    "Requests",
    "Keep-alive",
    "Loaded at",
)
KEEP_ALIVE_COLUMN = COLUMNS.index("Keep-alive")
# the speech runtime's name (app/runtimes/speech): a Whisper model has no prompt context
SPEECH_RUNTIME = "faster-whisper"
_NUMERIC = {COLUMNS.index(c) for c in ("Context", "Memory", "Requests")}
ID_ROLE = Qt.ItemDataRole.UserRole


class LoadedModelsTableModel(RowTableModel):
    """Rows are ``LoadedInfo`` snapshots. The keep-alive column is computed from the clock at
    paint time, so ``tick()`` (once a second) is all a countdown needs."""

    columns = COLUMNS

    def __init__(self, parent: Any = None, *, clock: Callable[[], float] = time.time) -> None:
        super().__init__(parent)
        self._rows: list[LoadedInfo] = []
        self._clock = clock

    # -- content -------------------------------------------------------------------------------
    def set_models(self, models: Sequence[LoadedInfo]) -> None:
        """Replace the rows; the same models in the same order update in place (the view keeps
        its selection and scroll position)."""
        new = list(models)
        if [m.model_id for m in new] == self.ids() and new:
            self._rows = new
            self.dataChanged.emit(self.index(0, 0), self.index(len(new) - 1, len(COLUMNS) - 1))
            return
        self._replace_rows(new)

    def tick(self) -> None:
        """Repaint the countdowns (the clock moved; nothing was refetched)."""
        if self._rows:
            top = self.index(0, KEEP_ALIVE_COLUMN)
            self.dataChanged.emit(top, self.index(len(self._rows) - 1, KEEP_ALIVE_COLUMN))

    def info(self, row: int) -> LoadedInfo:
        return self._rows[row]

    def row_of(self, model_id: str) -> int:
        return next((i for i, m in enumerate(self._rows) if m.model_id == model_id), -1)

    def ids(self) -> list[str]:
        return [m.model_id for m in self._rows]

    # -- QAbstractTableModel --------------------------------------------------------------------
    def data(self, index: Index, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if not index.isValid() or not 0 <= index.row() < len(self._rows):
            return None
        m = self._rows[index.row()]
        col = index.column()
        if role == Qt.ItemDataRole.DisplayRole:
            return self._display(m, col)
        if role == ID_ROLE:
            return m.model_id
        if role == Qt.ItemDataRole.ToolTipRole:
            return self._tooltip(m)
        if role == Qt.ItemDataRole.TextAlignmentRole and col in _NUMERIC:
            return int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        if role == Qt.ItemDataRole.ForegroundRole and col == KEEP_ALIVE_COLUMN and m.pinned:
            return QColor("#0b57d0")
        return None

    def _display(self, m: LoadedInfo, col: int) -> str:
        if col == KEEP_ALIVE_COLUMN:
            return keep_alive_text(m, self._clock())
        speech = m.runtime == SPEECH_RUNTIME
        values = (
            m.model_id,
            f"Speech to text ({m.runtime})" if speech else m.runtime,
            "" if speech else grouped(m.context_length),
            human_bytes(m.memory_bytes),
            str(m.pending) if m.pending else "",
            time.strftime("%H:%M:%S", time.localtime(m.loaded_at)),
        )
        return values[col if col < KEEP_ALIVE_COLUMN else col - 1]

    @staticmethod
    def _tooltip(m: LoadedInfo) -> str:
        o = m.options
        setup = f"Context {m.context_length:,} tokens"
        if m.runtime == SPEECH_RUNTIME:
            setup = f"Speech to text · CPU threads {o.threads or 'auto'}"
        elif m.runtime != "mlx":  # the rest are llama.cpp options
            setup += f" · KV cache {o.kv_type} · flash attention {o.flash_attention}"
        lines = [
            m.model_id,
            setup,
            f"Keep-alive: {'pinned' if m.pinned else ttl_text(m.ttl)}",
            f"Last used {time.strftime('%H:%M:%S', time.localtime(m.last_used))}",
        ]
        return "\n".join(lines)
