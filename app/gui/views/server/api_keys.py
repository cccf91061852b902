"""The Server page's API keys: list the named keys, add one (limits, model patterns,
admin role) and copy its secret the one time it is shown, remove one. It edits keys.json
itself, as ``hearth keys`` does (on the loop thread, through the bridge: the GUI thread never
touches files); a running server sees each change at its next request."""

from __future__ import annotations

import logging
import time

from PySide6.QtWidgets import (
    QAbstractItemView,
    QCheckBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QPushButton,
    QSpinBox,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.core.gateway.keys import ApiKey, KeyStore
from app.gui.bridge import Bridge, error_text
from app.gui.views.common import MessageBanner
from app.gui.views.copied import copy_text
from app.settings import generate_key

log = logging.getLogger(__name__)

KEY_COLUMNS = ("Name", "Role", "Requests/min", "Tokens/min", "Models", "Last used")


def _when(ts: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(ts)) if ts else "never"


class KeysSection(QWidget):
    def __init__(self, store: KeyStore, bridge: Bridge, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._store = store
        self._bridge = bridge
        self.table = QTableWidget(0, len(KEY_COLUMNS))
        self.table.setHorizontalHeaderLabels(KEY_COLUMNS)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.verticalHeader().hide()
        self.table.horizontalHeader().setSectionResizeMode(
            KEY_COLUMNS.index("Models"), QHeaderView.ResizeMode.Stretch
        )
        self.name_edit = QLineEdit()
        self.name_edit.setPlaceholderText("name, e.g. alice")
        self.rpm_spin = QSpinBox()
        self.tpm_spin = QSpinBox()
        for spin in (self.rpm_spin, self.tpm_spin):
            spin.setRange(0, 100_000_000)
            spin.setSpecialValueText("no limit")
        self.models_edit = QLineEdit()
        self.models_edit.setPlaceholderText("models (patterns, comma-separated; empty = all)")
        self.admin_check = QCheckBox("Admin")
        self.admin_check.setToolTip("May load, unload, pin, download and change presets")
        self.add_button = QPushButton("Add key")
        self.remove_button = QPushButton("Remove")
        self.secret_edit = QLineEdit()
        self.secret_edit.setReadOnly(True)
        self.secret_edit.setPlaceholderText("A new key appears here once: copy it now")
        self.copy_button = QPushButton("Copy key")
        self.copy_button.setEnabled(False)
        self.banner = MessageBanner()

        add_row = QHBoxLayout()
        add_row.addWidget(self.name_edit, 1)
        add_row.addWidget(QLabel("rpm"))
        add_row.addWidget(self.rpm_spin)
        add_row.addWidget(QLabel("tpm"))
        add_row.addWidget(self.tpm_spin)
        add_row.addWidget(self.models_edit, 2)
        add_row.addWidget(self.admin_check)
        add_row.addWidget(self.add_button)
        secret_row = QHBoxLayout()
        secret_row.addWidget(self.secret_edit, 1)
        secret_row.addWidget(self.copy_button)
        secret_row.addWidget(self.remove_button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(QLabel("API keys (once one exists, every request needs a key)"))
        layout.addWidget(self.banner)
        layout.addWidget(self.table, 1)
        layout.addLayout(add_row)
        layout.addLayout(secret_row)

        self.add_button.clicked.connect(self._on_add_button_clicked)
        self.remove_button.clicked.connect(self._on_remove_button_clicked)
        self.copy_button.clicked.connect(self._on_copy_button_clicked)
        self.refresh()

    def refresh(self) -> None:
        self._bridge.call(self._read, on_done=self._show, on_error=self._failed)

    def _read(self) -> list[ApiKey]:
        return [k for k in self._store.all().values() if k.name]

    def _failed(self, exc: BaseException) -> None:
        self.banner.show_message(error_text(exc), "error")

    def _show(self, keys: list[ApiKey]) -> None:
        self.table.setRowCount(len(keys))
        for r, k in enumerate(keys):
            cells = (
                k.name,
                "admin" if k.admin else "user",
                str(k.rpm) if k.rpm else "no limit",
                str(k.tpm) if k.tpm else "no limit",
                ", ".join(k.models) or "all",
                _when(k.last_used_at),
            )
            for c, text in enumerate(cells):
                self.table.setItem(r, c, QTableWidgetItem(text))

    def add_key(self) -> None:
        """Create the key from the fields; its secret is shown this once."""
        secret = generate_key()
        models = [m.strip() for m in self.models_edit.text().split(",") if m.strip()]
        name, rpm, tpm = self.name_edit.text().strip(), self.rpm_spin.value(), self.tpm_spin.value()
        admin = self.admin_check.isChecked()

        def add() -> list[ApiKey]:
            self._store.add(name, secret, rpm=rpm, tpm=tpm, models=models, admin=admin)
            return self._read()

        def added(keys: list[ApiKey]) -> None:
            self.banner.clear_message()
            self.secret_edit.setText(secret)
            self.copy_button.setEnabled(True)
            self.name_edit.clear()
            self.models_edit.clear()
            self.admin_check.setChecked(False)
            self._show(keys)

        self._bridge.call(add, on_done=added, on_error=self._failed)

    def remove_selected(self) -> None:
        rows = self.table.selectionModel().selectedRows()
        item = self.table.item(rows[0].row(), 0) if rows else None
        if item is None:
            self.banner.show_message("Select a key to remove.", "info")
            return
        name = item.text()

        def remove() -> list[ApiKey]:
            self._store.remove(name)
            return self._read()

        def removed(keys: list[ApiKey]) -> None:
            self.banner.clear_message()
            self._show(keys)

        self._bridge.call(remove, on_done=removed, on_error=self._failed)

    def copy_secret(self) -> None:
        """Copy the new key, then forget it: it is never shown again."""
        copy_text(self.secret_edit.text(), self.copy_button)
        self.secret_edit.clear()
        self.copy_button.setEnabled(False)
        self.banner.show_message("Key copied. Hearth keeps only its hash.", "info")

    def _on_add_button_clicked(self) -> None:
        self.add_key()

    def _on_remove_button_clicked(self) -> None:
        self.remove_selected()

    def _on_copy_button_clicked(self) -> None:
        self.copy_secret()
