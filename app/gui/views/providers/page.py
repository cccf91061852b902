"""The Providers page: remote engines Hearth routes to (their state, latency and models, from
the pool's background probes), the aliases whose ordered targets are fallback chains, and the
replica groups (app/gui/views/providers/groups.py)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QColor, QHideEvent, QIcon, QPainter, QPixmap, QShowEvent
from PySide6.QtWidgets import (
    QAbstractItemView,
    QGroupBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QMessageBox,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.core.gateway.providers.manage import ProviderTest
from app.core.gateway.providers.pool import ProviderStatus
from app.core.service import Hearth
from app.gui.bridge import Bridge, log_failure
from app.gui.views.common import PAGE_MARGINS, MessageBanner, page_title
from app.gui.views.providers.dialogs import AddProviderDialog, AliasDialog
from app.gui.views.providers.groups import GroupsBox

log = logging.getLogger(__name__)

TITLE = "Providers"
REFRESH_MS = 2000  # the pool probes in the background; the page re-reads its states this often
COLUMNS = ("State", "Name", "Kind", "URL", "Prefix", "Latency", "Models")
STATE_COLORS = {
    "ready": "#1a7f37",
    "starting": "#d4a106",
    "unreachable": "#b3261e",
    "unauthorized": "#c25e00",
    "error": "#b3261e",
}


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What the page shows, read on the loop in one call."""

    providers: tuple[ProviderStatus, ...]
    aliases: dict[str, tuple[str, ...]]
    local_ids: tuple[str, ...]
    remote_ids: tuple[str, ...]
    groups: tuple[dict[str, Any], ...] = ()


def state_icon(state: str) -> QIcon:
    pix = QPixmap(12, 12)
    pix.fill(Qt.GlobalColor.transparent)
    p = QPainter(pix)
    p.setRenderHint(QPainter.RenderHint.Antialiasing)
    p.setBrush(QColor(STATE_COLORS.get(state, "#8a8a8a")))
    p.setPen(Qt.PenStyle.NoPen)
    p.drawEllipse(1, 1, 10, 10)
    p.end()
    return QIcon(pix)


def report_text(result: ProviderTest) -> str:
    """One line per step, then the verdict (the reason when it failed)."""
    lines = [f"{'✓' if s.ok else '✗'} {s.name}: {s.detail}" for s in result.steps]
    verdict = "ok" if result.ok else f"failed: {result.reason or 'no steps ran'}"
    return "\n".join([f"Test of {result.name}: {verdict}", *lines])


class ProvidersPage(QWidget):
    """Add / Test / Remove providers; add, edit and remove aliases (their fallback order)."""

    refreshed = Signal()  # the tables show a fresh snapshot
    remote_models_changed = Signal()  # the set of remote model ids changed (Chat re-lists)
    test_finished = Signal(object)  # ProviderTest

    def __init__(
        self,
        service: Hearth,
        bridge: Bridge,
        parent: QWidget | None = None,
        *,
        refresh_ms: int = REFRESH_MS,
    ) -> None:
        super().__init__(parent)
        self._service = service
        self._bridge = bridge
        self._refreshing = False
        self._again = False  # a refresh was asked for while one was in flight
        self.snapshot: Snapshot | None = None
        self.add_dialog: AddProviderDialog | None = None
        self.alias_dialog: AliasDialog | None = None
        self.last_test: ProviderTest | None = None
        self.testing = False

        self.banner = MessageBanner()
        self.add_button = QPushButton("Add…")
        self.test_button = QPushButton("Test")
        self.remove_button = QPushButton("Remove")
        header = QHBoxLayout()
        header.addWidget(page_title(TITLE))
        header.addStretch(1)
        header.addWidget(self.add_button)
        header.addWidget(self.test_button)
        header.addWidget(self.remove_button)

        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.verticalHeader().hide()
        self.table.setAlternatingRowColors(True)
        hh = self.table.horizontalHeader()
        hh.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        hh.setSectionResizeMode(COLUMNS.index("URL"), QHeaderView.ResizeMode.Stretch)
        self.empty_label = QLabel(
            "No providers yet. Add a remote engine (vLLM, SGLang, llama.cpp, Ollama, TGI, another "
            "Hearth or an OpenAI-compatible API) and its models appear as PREFIX/model everywhere."
        )
        self.empty_label.setWordWrap(True)
        self.empty_label.setStyleSheet("color:#6b6b6b")
        self.test_label = QLabel("")
        self.test_label.setWordWrap(True)
        self.test_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)

        self.alias_table = QTableWidget(0, 2)
        self.alias_table.setHorizontalHeaderLabels(("Alias", "Targets (fallback order)"))
        self.alias_table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.alias_table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.alias_table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.alias_table.verticalHeader().hide()
        ah = self.alias_table.horizontalHeader()
        ah.setSectionResizeMode(0, QHeaderView.ResizeMode.ResizeToContents)
        ah.setSectionResizeMode(1, QHeaderView.ResizeMode.Stretch)
        self.add_alias_button = QPushButton("Add alias…")
        self.edit_alias_button = QPushButton("Edit…")
        self.remove_alias_button = QPushButton("Remove alias")
        alias_buttons = QHBoxLayout()
        alias_buttons.addStretch(1)
        alias_buttons.addWidget(self.add_alias_button)
        alias_buttons.addWidget(self.edit_alias_button)
        alias_buttons.addWidget(self.remove_alias_button)
        alias_box = QGroupBox("Aliases")
        ab = QVBoxLayout(alias_box)
        ab.addWidget(
            QLabel("A name clients may use (gpt-4o-mini, claude-sonnet-4) for one or more targets.")
        )
        ab.addWidget(self.alias_table, 1)
        ab.addLayout(alias_buttons)

        layout = QVBoxLayout(self)
        layout.setContentsMargins(*PAGE_MARGINS)
        layout.addLayout(header)
        layout.addWidget(self.banner)
        layout.addWidget(self.empty_label)
        layout.addWidget(self.table, 2)
        layout.addWidget(self.test_label)
        layout.addWidget(alias_box, 1)
        self.groups_box = GroupsBox(service, bridge)
        layout.addWidget(self.groups_box, 1)

        self.refresh_timer = QTimer(self)
        self.refresh_timer.setInterval(refresh_ms)
        self.refresh_timer.timeout.connect(self._on_refresh_timer_timeout)
        self.add_button.clicked.connect(self._on_add_button_clicked)
        self.test_button.clicked.connect(self._on_test_button_clicked)
        self.remove_button.clicked.connect(self._on_remove_button_clicked)
        self.add_alias_button.clicked.connect(self._on_add_alias_button_clicked)
        self.edit_alias_button.clicked.connect(self._on_edit_alias_button_clicked)
        self.remove_alias_button.clicked.connect(self._on_remove_alias_button_clicked)
        self.table.itemSelectionChanged.connect(self._update_buttons)
        self.alias_table.itemSelectionChanged.connect(self._update_buttons)
        self.alias_table.itemDoubleClicked.connect(self._on_alias_table_item_double_clicked)
        bridge.library_changed.connect(self._on_bridge_library_changed)
        self.groups_box.changed.connect(self._on_changed)
        self.groups_box.failed.connect(self._show_error)
        self._update_buttons()
        self.refresh()

    # -- reading ---------------------------------------------------------------------------------
    def refresh(self) -> None:
        """Re-read providers and aliases on the loop (one call in flight at a time)."""
        if self._refreshing:
            self._again = True
            return
        self._refreshing = True
        self._bridge.call(self._read, on_done=self._on_read, on_error=self._on_read_failed)

    def _read(self) -> Snapshot:
        # loop thread: reading the statuses also starts probing a provider added just now
        s = self._service
        return Snapshot(
            tuple(s.routing.provider_statuses()),
            s.routing.aliases(),
            tuple(m.model.id for m in s.models.all()),
            tuple(r.id for r in s.routing.remote_models()),
            tuple(s.routing.groups.statuses()) if s.routing.groups is not None else (),
        )

    def provider_names(self) -> list[str]:
        return [p.name for p in self.snapshot.providers] if self.snapshot else []

    def status(self, name: str) -> ProviderStatus | None:
        found = [p for p in self.snapshot.providers if p.name == name] if self.snapshot else []
        return found[0] if found else None

    def selected_provider(self) -> str | None:
        rows = self.table.selectionModel().selectedRows()
        if not rows:
            return None
        item = self.table.item(rows[0].row(), COLUMNS.index("Name"))
        return item.text() if item is not None else None

    def select_provider(self, name: str) -> None:
        for row in range(self.table.rowCount()):
            item = self.table.item(row, COLUMNS.index("Name"))
            if item is not None and item.text() == name:
                self.table.selectRow(row)

    def selected_alias(self) -> str | None:
        rows = self.alias_table.selectionModel().selectedRows()
        if not rows:
            return None
        item = self.alias_table.item(rows[0].row(), 0)
        return item.text() if item is not None else None

    def select_alias(self, name: str) -> None:
        for row in range(self.alias_table.rowCount()):
            item = self.alias_table.item(row, 0)
            if item is not None and item.text() == name:
                self.alias_table.selectRow(row)

    def alias_candidates(self) -> list[str]:
        """What an alias may point at: local models, remote models, other aliases."""
        s = self.snapshot
        if s is None:
            return []
        return [*s.local_ids, *s.remote_ids, *s.aliases]

    # -- actions ---------------------------------------------------------------------------------
    def open_add_dialog(self) -> AddProviderDialog:
        dialog = AddProviderDialog(self._service, self._bridge, self)
        dialog.provider_added.connect(self._on_add_dialog_provider_added)
        dialog.finished.connect(self._on_dialog_finished)
        self.add_dialog = dialog
        dialog.open()
        return dialog

    def open_alias_dialog(self, name: str | None = None) -> AliasDialog:
        targets = self.snapshot.aliases.get(name, ()) if self.snapshot and name else ()
        dialog = AliasDialog(
            self._service,
            self._bridge,
            self.alias_candidates(),
            self,
            name=name or "",
            targets=targets,
        )
        dialog.alias_saved.connect(self._on_alias_dialog_alias_saved)
        dialog.finished.connect(self._on_dialog_finished)
        self.alias_dialog = dialog
        dialog.open()
        return dialog

    def test_provider(self, name: str) -> None:
        self.test_label.setText(f"Testing {name}…")
        self.test_label.setStyleSheet("")
        self.testing = True
        self._update_buttons()
        self._bridge.run(
            self._service.routing.test_provider(name),
            on_done=self._on_tested,
            on_error=lambda exc: self._on_test_failed(name, exc),
        )

    def remove_provider(self, name: str) -> None:
        self._bridge.call(
            self._service.routing.remove_provider,
            name,
            on_done=lambda _: self._on_changed(),
            on_error=lambda exc: self._show_error(log_failure(log, "removing a provider", exc)),
        )

    def remove_alias(self, name: str) -> None:
        self._bridge.call(
            self._service.routing.remove_alias,
            name,
            on_done=lambda _: self._on_changed(),
            on_error=lambda exc: self._show_error(log_failure(log, "removing an alias", exc)),
        )

    # -- visibility: poll only while shown -----------------------------------------------------
    def showEvent(self, e: QShowEvent) -> None:  # noqa: N802 - Qt override
        super().showEvent(e)
        self.refresh_timer.start()
        self.refresh()

    def hideEvent(self, e: QHideEvent) -> None:  # noqa: N802 - Qt override
        super().hideEvent(e)
        self.refresh_timer.stop()

    # -- slots -----------------------------------------------------------------------------------
    def _on_refresh_timer_timeout(self) -> None:
        self.refresh()

    def _on_bridge_library_changed(self) -> None:
        self.refresh()  # local ids are alias candidates

    def _on_add_button_clicked(self) -> None:
        self.open_add_dialog()

    def _on_test_button_clicked(self) -> None:
        if name := self.selected_provider():
            self.test_provider(name)

    def _on_remove_button_clicked(self) -> None:
        name = self.selected_provider()
        if name is None:
            return
        answer = QMessageBox.question(
            self, "Remove provider", f"Remove the provider {name}? Its models leave every list."
        )
        if answer == QMessageBox.StandardButton.Yes:
            self.remove_provider(name)

    def _on_add_alias_button_clicked(self) -> None:
        self.open_alias_dialog()

    def _on_edit_alias_button_clicked(self) -> None:
        if name := self.selected_alias():
            self.open_alias_dialog(name)

    def _on_alias_table_item_double_clicked(self, _item: QTableWidgetItem) -> None:
        self._on_edit_alias_button_clicked()

    def _on_remove_alias_button_clicked(self) -> None:
        name = self.selected_alias()
        if name is None:
            return
        answer = QMessageBox.question(self, "Remove alias", f"Remove the alias {name}?")
        if answer == QMessageBox.StandardButton.Yes:
            self.remove_alias(name)

    def _on_add_dialog_provider_added(self, _cfg: object) -> None:
        self._on_changed()

    def _on_alias_dialog_alias_saved(self, _name: str, _targets: object) -> None:
        self._on_changed()

    def _on_dialog_finished(self, _result: int) -> None:
        if self.sender() is self.add_dialog:
            self.add_dialog = None
        elif self.sender() is self.alias_dialog:
            self.alias_dialog = None

    def _on_changed(self) -> None:
        self.banner.clear_message()
        self.refresh()

    def _on_read(self, snap: Snapshot) -> None:
        self._refreshing = False
        old = self.snapshot
        self.snapshot = snap
        self._fill_providers(snap.providers)
        self._fill_aliases(snap.aliases)
        self.groups_box.fill(snap.groups)
        self._update_buttons()
        if old is None or old.remote_ids != snap.remote_ids:
            self.remote_models_changed.emit()
        self.refreshed.emit()
        if self._again:
            self._again = False
            self.refresh()

    def _on_read_failed(self, exc: BaseException) -> None:
        self._refreshing = False
        self._show_error(log_failure(log, "reading the providers", exc))

    def _on_tested(self, result: ProviderTest) -> None:
        self.testing = False
        self.last_test = result
        self.test_label.setText(report_text(result))
        self.test_label.setStyleSheet("" if result.ok else "color:#b3261e")
        self._update_buttons()
        self.refresh()  # a test probes; the state may have changed
        self.test_finished.emit(result)

    def _on_test_failed(self, name: str, exc: BaseException) -> None:
        self.testing = False
        text = log_failure(log, f"testing provider {name}", exc)
        self.test_label.setText(f"Test of {name}: failed: {text}")
        self.test_label.setStyleSheet("color:#b3261e")
        self._update_buttons()

    # -- helpers ---------------------------------------------------------------------------------
    def _fill_providers(self, statuses: tuple[ProviderStatus, ...]) -> None:
        keep = self.selected_provider()
        self.table.setRowCount(len(statuses))
        for row, p in enumerate(statuses):
            # a refused connection's "latency" says nothing about the engine
            ok = p.state == "ready" and p.latency_ms is not None
            latency = f"{p.latency_ms:.0f} ms" if ok else "—"
            cells = (p.state, p.name, p.kind, p.url, p.prefix, latency, str(len(p.models)))
            tip = p.error or (", ".join(p.models) if p.models else p.state)
            for col, text in enumerate(cells):
                item = QTableWidgetItem(text)
                item.setToolTip(tip)
                if col == 0:
                    item.setIcon(state_icon(p.state))
                self.table.setItem(row, col, item)
        self.empty_label.setVisible(not statuses)
        if keep is not None:
            self.select_provider(keep)

    def _fill_aliases(self, aliases: dict[str, tuple[str, ...]]) -> None:
        keep = self.selected_alias()
        self.alias_table.setRowCount(len(aliases))
        for row, (name, targets) in enumerate(aliases.items()):
            self.alias_table.setItem(row, 0, QTableWidgetItem(name))
            self.alias_table.setItem(row, 1, QTableWidgetItem(" → ".join(targets)))
        if keep is not None:
            self.select_alias(keep)

    def _update_buttons(self) -> None:
        has = self.selected_provider() is not None
        self.test_button.setEnabled(has and not self.testing)
        self.remove_button.setEnabled(has)
        alias = self.selected_alias() is not None
        self.edit_alias_button.setEnabled(alias)
        self.remove_alias_button.setEnabled(alias)

    def _show_error(self, text: str) -> None:
        self.banner.show_message(text, "error")
