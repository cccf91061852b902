"""The "Models in memory" page: what is loaded, what it costs, and when it unloads."""

from __future__ import annotations

import logging

from PySide6.QtCore import QEvent, QItemSelectionModel, Qt, QTimer, Signal
from PySide6.QtGui import QAction
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QMenu,
    QProgressBar,
    QPushButton,
    QStackedWidget,
    QTableView,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.core.service import Hearth
from app.gui.bridge import Bridge, log_failure
from app.gui.models.memory import (
    COLUMNS,
    LoadedModelsTableModel,
    MemoryMonitor,
    MemorySnapshot,
    ttl_text,
)
from app.gui.theme import is_dark, pick, theme_signals
from app.gui.units import human_bytes
from app.gui.views.common import PAGE_MARGINS, MessageBanner, page_title

log = logging.getLogger(__name__)

TITLE = "Models in memory"
EMPTY_TEXT = (
    "<h3>No models loaded</h3>"
    "<p>Load one from the <b>Library</b>: its Load button lets you choose the context length, "
    "see how much memory it will take, and how long it stays loaded.</p>"
    "<p style='color:#666'>Models used through the API load on demand and show up here too.</p>"
)
HINT_TEXT = (
    "Idle models unload when their keep-alive runs out. Pinned models stay loaded and are never "
    "unloaded to make room for another model."
)
# (label, seconds idle; None = never) for the "Unload after" menu
KEEP_ALIVE_CHOICES: tuple[tuple[str, float | None], ...] = (
    ("Never (keep loaded)", None),
    ("5 minutes idle", 300.0),
    ("15 minutes idle", 900.0),
    ("1 hour idle", 3600.0),
)
_BAR_STYLE = (
    "QProgressBar {{ border:1px solid {border}; border-radius:3px; background:{groove}; }}"
    "QProgressBar::chunk {{ background:{color}; border-radius:2px; }}"
)
# (light, dark) colours of the bar: the groove, its border, and the fill by how full it is
_BAR_GROOVE = ("#f3f3f3", "#1f1f1f")
_BAR_BORDER = ("#c8c8c8", "#5a5a5a")
_BAR_FILL = {
    "ok": ("#1a7f37", "#3fb56a"),
    "high": ("#b26a00", "#e0a030"),
    "over": ("#b3261e", "#f0766b"),
}


def memory_summary(snapshot: MemorySnapshot) -> str:
    """``"1.2 GiB of 12.5 GiB budget in use (10%)"``."""
    pct = 100 * snapshot.used / snapshot.budget if snapshot.budget else 0
    return (
        f"{human_bytes(snapshot.used)} of {human_bytes(snapshot.budget)} budget in use ({pct:.0f}%)"
    )


class MemoryPage(QWidget):
    """Shows the MemoryMonitor's snapshot; unloads, pins and sets keep-alives through the core.
    A 1 s timer repaints the countdowns from the cached snapshot (no core call)."""

    refreshed = Signal()  # the table shows a new snapshot
    reload_requested = Signal(str)  # model id: the window opens its Load dialog to reload it

    def __init__(
        self,
        service: Hearth,
        bridge: Bridge,
        monitor: MemoryMonitor,
        parent: QWidget | None = None,
    ) -> None:
        super().__init__(parent)
        self._service = service
        self._bridge = bridge
        self._monitor = monitor
        self.table_model = LoadedModelsTableModel(self)
        self._bar_dark: bool | None = None  # the bar's colours were picked for a dark palette
        theme_signals().changed.connect(self._on_theme_changed)

        self.keep_alive_button = QToolButton()
        self.keep_alive_button.setText("Unload after")
        self.keep_alive_button.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)
        self.keep_alive_menu = QMenu(self)
        self.keep_alive_actions: list[QAction] = []
        for label, seconds in KEEP_ALIVE_CHOICES:
            action = self.keep_alive_menu.addAction(label)
            action.setData(seconds)
            action.triggered.connect(
                lambda _checked=False, s=seconds: self._on_keep_alive_action_triggered(s)
            )
            self.keep_alive_actions.append(action)
        self.keep_alive_button.setMenu(self.keep_alive_menu)
        self.pin_button = QPushButton("Pin")
        self.pin_button.setToolTip("Pinned models stay loaded: no idle unload, never evicted")
        self.unload_button = QPushButton("Unload")
        self.reload_button = QPushButton("Reload…")
        self.reload_button.setToolTip("Reload with other options (context length and more)")
        header = QHBoxLayout()
        header.addWidget(page_title(TITLE))
        header.addStretch(1)
        for w in (self.reload_button, self.keep_alive_button, self.pin_button, self.unload_button):
            header.addWidget(w)

        self.banner = MessageBanner()

        self.memory_bar = QProgressBar()
        self.memory_bar.setRange(0, 1000)
        self.memory_bar.setTextVisible(False)
        self.memory_bar.setFixedHeight(14)
        self.memory_bar.setMinimumWidth(100)  # the window's minimum width fits it and its text
        self.memory_label = QLabel()
        self.loading_label = QLabel()
        self.loading_label.setStyleSheet("color:#7a4b00")
        bar_row = QHBoxLayout()
        bar_row.addWidget(QLabel("Memory"))
        bar_row.addWidget(self.memory_bar, 1)
        bar_row.addWidget(self.memory_label)
        bar_row.addWidget(self.loading_label)

        self.table = QTableView()
        self.table.setModel(self.table_model)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.setAlternatingRowColors(True)
        self.table.verticalHeader().hide()
        self.table.setWordWrap(False)
        self.table.setShowGrid(False)
        hh = self.table.horizontalHeader()
        hh.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        hh.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)

        self.empty_label = QLabel(EMPTY_TEXT)
        self.empty_label.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.empty_label.setWordWrap(True)
        self.content = QStackedWidget()
        self.content.addWidget(self.empty_label)
        self.content.addWidget(self.table)

        hint = QLabel(HINT_TEXT)
        hint.setWordWrap(True)
        hint.setStyleSheet("color:#6b6b6b")

        layout = QVBoxLayout(self)
        layout.setContentsMargins(*PAGE_MARGINS)
        layout.addLayout(header)
        layout.addWidget(self.banner)
        layout.addLayout(bar_row)
        layout.addWidget(self.content, 1)
        layout.addWidget(hint)

        self.countdown_timer = QTimer(self)
        self.countdown_timer.setInterval(1000)
        self.countdown_timer.timeout.connect(self._on_countdown_timer_timeout)
        self.countdown_timer.start()

        self.pin_button.clicked.connect(self._on_pin_button_clicked)
        self.unload_button.clicked.connect(self._on_unload_button_clicked)
        self.reload_button.clicked.connect(self._on_reload_button_clicked)
        self.table.selectionModel().selectionChanged.connect(self._on_table_selection_changed)
        monitor.refreshed.connect(self._on_monitor_refreshed)
        self._on_monitor_refreshed(monitor.snapshot)

    # -- what the user sees ------------------------------------------------------------------------
    def selected_id(self) -> str | None:
        rows = self.table.selectionModel().selectedRows()
        if not rows:
            return None
        return self.table_model.info(rows[0].row()).model_id

    def select(self, model_id: str) -> None:
        row = self.table_model.row_of(model_id)
        if row < 0:
            return
        flags = (
            QItemSelectionModel.SelectionFlag.ClearAndSelect
            | QItemSelectionModel.SelectionFlag.Rows
        )
        self.table.selectionModel().select(self.table_model.index(row, 0), flags)

    def cell(self, model_id: str, column: str) -> str:
        """The text a column shows for a model ("" when it is not listed)."""
        row = self.table_model.row_of(model_id)
        if row < 0:
            return ""
        return str(self.table_model.index(row, COLUMNS.index(column)).data() or "")

    # -- actions -------------------------------------------------------------------------------------
    def unload_model(self, model_id: str) -> None:
        self.banner.clear_message()
        self._bridge.run(
            self._service.models.unload(model_id),
            on_done=self._on_action_done,
            on_error=self._show_error,
        )

    def set_pinned(self, model_id: str, pinned: bool) -> None:
        self.banner.clear_message()
        self._bridge.call(
            self._service.models.set_pinned,
            model_id,
            pinned,
            on_done=self._on_action_done,
            on_error=self._show_error,
        )

    def set_keep_alive(self, model_id: str, seconds: float | None) -> None:
        """Unload ``model_id`` after this long idle (None = never), counted from now."""
        self.banner.clear_message()
        self._bridge.call(
            self._service.models.set_ttl,
            model_id,
            seconds,
            on_done=self._on_action_done,
            on_error=self._show_error,
        )

    # -- slots ---------------------------------------------------------------------------------------
    def _on_pin_button_clicked(self) -> None:
        mid = self.selected_id()
        if mid is None:
            return
        info = self.table_model.info(self.table_model.row_of(mid))
        self.set_pinned(mid, not info.pinned)

    def _on_reload_button_clicked(self) -> None:
        if mid := self.selected_id():
            self.reload_requested.emit(mid)

    def _on_unload_button_clicked(self) -> None:
        if mid := self.selected_id():
            self.unload_model(mid)

    def _on_keep_alive_action_triggered(self, seconds: float | None) -> None:
        if mid := self.selected_id():
            self.set_keep_alive(mid, seconds)

    def _on_table_selection_changed(self, *_: object) -> None:
        self._update_buttons()

    def _on_countdown_timer_timeout(self) -> None:
        self.table_model.tick()

    def _on_action_done(self, _: object) -> None:
        self._monitor.refresh()

    def _on_monitor_refreshed(self, snapshot: MemorySnapshot) -> None:
        keep = self.selected_id()
        self.table_model.set_models(snapshot.models)
        self.content.setCurrentIndex(1 if snapshot.models else 0)
        if keep and self.table_model.row_of(keep) >= 0:
            self.select(keep)
        elif self.table_model.rowCount() and self.selected_id() is None:
            self.select(self.table_model.ids()[0])  # so the buttons work at once
        self._show_memory(snapshot)
        self._update_buttons()
        self.refreshed.emit()

    def changeEvent(self, e: QEvent) -> None:  # noqa: N802 - Qt override
        super().changeEvent(e)
        # the theme flipped between light and dark: recolour the bar
        if e.type() in (QEvent.Type.PaletteChange, QEvent.Type.ApplicationPaletteChange):
            self._on_theme_changed()

    def _on_theme_changed(self) -> None:
        if self._bar_dark is not None and self._bar_dark != is_dark():
            self._show_memory(self._monitor.snapshot)  # recolour the bar

    def _show_error(self, error: BaseException) -> None:
        self.banner.show_message(log_failure(log, "memory page action failed", error), "error")
        self._monitor.refresh()

    # -- helpers -------------------------------------------------------------------------------------
    def _show_memory(self, snapshot: MemorySnapshot) -> None:
        ratio = snapshot.used / snapshot.budget if snapshot.budget else 0.0
        self.memory_bar.setValue(min(1000, round(ratio * 1000)))
        fill = _BAR_FILL["ok" if ratio <= 0.8 else ("high" if ratio <= 1.0 else "over")]
        self._bar_dark = is_dark()
        self.memory_bar.setStyleSheet(
            _BAR_STYLE.format(
                color=pick(*fill), groove=pick(*_BAR_GROOVE), border=pick(*_BAR_BORDER)
            )
        )
        self.memory_label.setText(memory_summary(snapshot))
        over = ratio > 1.0
        self.memory_label.setStyleSheet(f"color:{pick(*_BAR_FILL['over'])}" if over else "")
        self.memory_bar.setToolTip(
            "Over the budget: a model was loaded anyway" if over else memory_summary(snapshot)
        )
        self.loading_label.setText(
            "Loading: " + ", ".join(snapshot.loading) if snapshot.loading else ""
        )

    def _update_buttons(self) -> None:
        mid = self.selected_id()
        info = self.table_model.info(self.table_model.row_of(mid)) if mid else None
        self.unload_button.setEnabled(info is not None)
        self.reload_button.setEnabled(info is not None)
        self.pin_button.setEnabled(info is not None)
        self.keep_alive_button.setEnabled(info is not None)
        self.pin_button.setText("Unpin" if info is not None and info.pinned else "Pin")
        self.keep_alive_button.setToolTip(
            f"Now: {'pinned' if info.pinned else ttl_text(info.ttl)}" if info else ""
        )
