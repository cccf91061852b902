"""The Providers page's replica groups: each group, its strategy and each member's state (ready,
open, half-open, cooling, unreachable) with its requests in flight; a dialog creates or
replaces one (name, members, strategy), and a group can be removed.
Tested by tests/gui/views/providers/test_groups.py."""

from __future__ import annotations

import logging
from typing import Any

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QMessageBox,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.core.gateway.groups.router import GroupRouter
from app.core.gateway.groups.store import STRATEGIES, GroupConfig
from app.core.service import Hearth
from app.errors import InvalidRequest
from app.gui.bridge import Bridge, log_failure
from app.gui.views.common import MessageBanner

log = logging.getLogger(__name__)

GROUP_COLUMNS = ("Group", "Strategy", "Members")


def groups_of(service: Hearth) -> GroupRouter:
    """The service's groups (InvalidRequest where they are off)."""
    if service.routing.groups is None:
        raise InvalidRequest("replica groups are not available here")
    return service.routing.groups


def member_text(m: dict[str, Any]) -> str:
    """``target (state)``, with the requests in flight when there are any."""
    busy = f", {m['in_flight']} in flight" if m.get("in_flight") else ""
    return f"{m['target']} ({m['state']}{busy})"


class GroupDialog(QDialog):
    """Create or replace a group: its name, its members (provider names or PREFIX/model, one
    per line or separated by spaces) and its strategy."""

    group_saved = Signal(str)
    save_failed = Signal(str)

    def __init__(self, service: Hearth, bridge: Bridge, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Replica group")
        self._service = service
        self._bridge = bridge
        self.saving = False
        self.name_edit = QLineEdit()
        self.name_edit.setPlaceholderText("the model id clients name, e.g. qwen3-8b")
        self.members_edit = QLineEdit()
        self.members_edit.setPlaceholderText("gpu1 gpu2  or  gpu1/Qwen/Qwen3-8B lan/Qwen/Qwen3-8B")
        self.strategy_combo = QComboBox()
        self.strategy_combo.addItems(list(STRATEGIES))
        self.banner = MessageBanner()
        self.buttons = QDialogButtonBox(
            QDialogButtonBox.StandardButton.Save | QDialogButtonBox.StandardButton.Cancel
        )
        self.save_button = self.buttons.button(QDialogButtonBox.StandardButton.Save)
        form = QFormLayout()
        form.addRow("Name", self.name_edit)
        form.addRow("Members", self.members_edit)
        form.addRow("Strategy", self.strategy_combo)
        hint = QLabel(
            "A member is a provider's name (its PREFIX + the group's name) or PREFIX/model. "
            "Requests go to a healthy member as the strategy picks; a failing one is skipped."
        )
        hint.setWordWrap(True)
        hint.setStyleSheet("color:#6b6b6b")
        layout = QVBoxLayout(self)
        layout.addWidget(self.banner)
        layout.addLayout(form)
        layout.addWidget(hint)
        layout.addWidget(self.buttons)
        self.setMinimumWidth(480)
        self.buttons.accepted.connect(self._on_buttons_accepted)
        self.buttons.rejected.connect(self.reject)

    def config(self) -> GroupConfig:
        members = tuple(self.members_edit.text().replace(",", " ").split())
        strategy = self.strategy_combo.currentText()
        return GroupConfig(self.name_edit.text().strip(), members, strategy=strategy)

    def save(self) -> None:
        if self.saving:
            return
        self.banner.clear_message()
        self.saving = True
        self.save_button.setEnabled(False)
        cfg = self.config()
        self._bridge.call(
            lambda: groups_of(self._service).set(cfg),
            on_done=lambda saved: self._on_saved(saved.name),
            on_error=self._on_save_failed,
        )

    def _on_buttons_accepted(self) -> None:
        self.save()

    def _on_saved(self, name: str) -> None:
        self.saving = False
        self.group_saved.emit(name)
        self.accept()

    def _on_save_failed(self, exc: BaseException) -> None:
        self.saving = False
        self.save_button.setEnabled(True)
        text = log_failure(log, "saving a group failed", exc)
        self.banner.show_message(text, "error")
        self.save_failed.emit(text)


class GroupsBox(QGroupBox):
    """The groups table with Add / Remove (see the module doc); ``changed``: the page re-reads."""

    changed = Signal()
    failed = Signal(str)

    def __init__(self, service: Hearth, bridge: Bridge, parent: QWidget | None = None) -> None:
        super().__init__("Replica groups", parent)
        self._service = service
        self._bridge = bridge
        self.dialog: GroupDialog | None = None
        self.table = QTableWidget(0, len(GROUP_COLUMNS))
        self.table.setHorizontalHeaderLabels(GROUP_COLUMNS)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.verticalHeader().hide()
        hh = self.table.horizontalHeader()
        hh.setSectionResizeMode(0, QHeaderView.ResizeMode.ResizeToContents)
        hh.setSectionResizeMode(1, QHeaderView.ResizeMode.ResizeToContents)
        hh.setSectionResizeMode(2, QHeaderView.ResizeMode.Stretch)
        self.add_button = QPushButton("Add group…")
        self.remove_button = QPushButton("Remove group")
        buttons = QHBoxLayout()
        buttons.addStretch(1)
        buttons.addWidget(self.add_button)
        buttons.addWidget(self.remove_button)
        layout = QVBoxLayout(self)
        layout.addWidget(
            QLabel("One model id served by several engines: each request goes to a healthy one.")
        )
        layout.addWidget(self.table, 1)
        layout.addLayout(buttons)
        self.add_button.clicked.connect(self._on_add_button_clicked)
        self.remove_button.clicked.connect(self._on_remove_button_clicked)
        self.table.itemSelectionChanged.connect(self._update_buttons)
        self._update_buttons()

    def fill(self, groups: tuple[dict[str, Any], ...]) -> None:
        keep = self.selected_group()
        self.table.setRowCount(len(groups))
        for row, g in enumerate(groups):
            members = " · ".join(member_text(m) for m in g["members"])
            errors = "\n".join(f"{m['target']}: {m['error']}" for m in g["members"] if m["error"])
            for col, text in enumerate((g["name"], g["strategy"], members)):
                item = QTableWidgetItem(text)
                item.setToolTip(errors or members)
                self.table.setItem(row, col, item)
        if keep is not None:
            self.select_group(keep)
        self._update_buttons()

    def selected_group(self) -> str | None:
        rows = self.table.selectionModel().selectedRows()
        if not rows:
            return None
        item = self.table.item(rows[0].row(), 0)
        return item.text() if item is not None else None

    def select_group(self, name: str) -> None:
        for row in range(self.table.rowCount()):
            item = self.table.item(row, 0)
            if item is not None and item.text() == name:
                self.table.selectRow(row)
                return

    def open_dialog(self) -> GroupDialog:
        self.dialog = GroupDialog(self._service, self._bridge, self)
        self.dialog.group_saved.connect(self._on_dialog_group_saved)
        self.dialog.show()
        return self.dialog

    def remove_group(self, name: str) -> None:
        self._bridge.call(
            lambda: groups_of(self._service).remove(name),
            on_done=lambda _: self.changed.emit(),
            on_error=lambda exc: self.failed.emit(log_failure(log, "removing a group", exc)),
        )

    def _on_add_button_clicked(self) -> None:
        self.open_dialog()

    def _on_remove_button_clicked(self) -> None:
        name = self.selected_group()
        if name is None:
            return
        answer = QMessageBox.question(self, "Remove group", f"Remove the group {name}?")
        if answer == QMessageBox.StandardButton.Yes:
            self.remove_group(name)

    def _on_dialog_group_saved(self, _name: str) -> None:
        self.changed.emit()

    def _update_buttons(self) -> None:
        self.remove_button.setEnabled(self.selected_group() is not None)
