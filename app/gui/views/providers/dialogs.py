"""The Providers page's dialogs: add a provider (a kind preset fills the usual URL) and edit an
alias's ordered targets. Both save through the service and show its errors inline.
Tested by tests/gui/views/providers/test_page.py."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QDoubleSpinBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app.core.gateway.providers.manage import DEFAULT_URLS
from app.core.gateway.providers.store import (
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_FIRST_TOKEN_TIMEOUT,
    DEFAULT_IDLE_TIMEOUT,
    KINDS,
    ProviderConfig,
)
from app.core.service import Hearth
from app.gui.bridge import Bridge, log_failure
from app.gui.views.common import MessageBanner

log = logging.getLogger(__name__)


def _timeout_spin(value: float) -> QDoubleSpinBox:
    spin = QDoubleSpinBox()
    spin.setRange(0.5, 86_400.0)
    spin.setDecimals(1)
    spin.setSuffix(" s")
    spin.setValue(value)
    return spin


class AddProviderDialog(QDialog):
    """Name, kind, URL, prefix, API key and timeouts. Saving calls ``add_provider`` on the loop;
    the dialog closes only when it succeeded, otherwise the error stays shown in it."""

    provider_added = Signal(object)  # the saved ProviderConfig
    add_failed = Signal(str)  # the message shown

    def __init__(self, service: Hearth, bridge: Bridge, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._service = service
        self._bridge = bridge
        self.saving = False
        self.setWindowTitle("Add provider")
        self.setModal(True)

        self.name_edit = QLineEdit()
        self.name_edit.setPlaceholderText("lan-gpu (lower case, digits, -)")
        self.kind_combo = QComboBox()
        self.kind_combo.addItems(KINDS)
        self.url_edit = QLineEdit()
        self.url_edit.setPlaceholderText(
            "the engine's OpenAI base URL, e.g. http://10.0.0.5:8000/v1"
        )
        self.prefix_edit = QLineEdit()
        self.prefix_edit.setPlaceholderText("NAME/")
        self.key_edit = QLineEdit()
        self.key_edit.setEchoMode(QLineEdit.EchoMode.Password)
        self.key_edit.setPlaceholderText("optional")
        self.connect_spin = _timeout_spin(DEFAULT_CONNECT_TIMEOUT)
        self.first_token_spin = _timeout_spin(DEFAULT_FIRST_TOKEN_TIMEOUT)
        self.idle_spin = _timeout_spin(DEFAULT_IDLE_TIMEOUT)
        self.redirects_check = QCheckBox("Follow the engine's redirects")
        self.redirects_check.setToolTip(
            "Off: an engine that answers with a redirect gets a 502, so a prompt is never "
            "posted to another address than this URL."
        )
        self.banner = MessageBanner()
        self.buttons = QDialogButtonBox(
            QDialogButtonBox.StandardButton.Save | QDialogButtonBox.StandardButton.Cancel
        )
        self.save_button = self.buttons.button(QDialogButtonBox.StandardButton.Save)

        form = QFormLayout()
        form.addRow("Kind", self.kind_combo)
        form.addRow("Name", self.name_edit)
        form.addRow("URL", self.url_edit)
        form.addRow("Prefix", self.prefix_edit)
        form.addRow("API key", self.key_edit)
        form.addRow("Connect timeout", self.connect_spin)
        form.addRow("First-token timeout", self.first_token_spin)
        form.addRow("Idle timeout", self.idle_spin)
        form.addRow("", self.redirects_check)
        layout = QVBoxLayout(self)
        layout.addWidget(self.banner)
        layout.addLayout(form)
        layout.addWidget(self.buttons)
        self.setMinimumWidth(480)

        self._preset_url = ""  # the URL the kind preset filled in (replaced on a kind change)
        self.kind_combo.currentTextChanged.connect(self._on_kind_combo_current_text_changed)
        self.name_edit.textChanged.connect(self._on_name_edit_text_changed)
        self.buttons.accepted.connect(self._on_buttons_accepted)
        self.buttons.rejected.connect(self.reject)
        self._on_kind_combo_current_text_changed(self.kind_combo.currentText())

    def config(self) -> ProviderConfig:
        """What the form says (validated by the service when saved)."""
        return ProviderConfig(
            name=self.name_edit.text().strip(),
            url=self.url_edit.text().strip(),
            kind=self.kind_combo.currentText(),
            prefix=self.prefix_edit.text().strip(),
            connect_timeout=self.connect_spin.value(),
            first_token_timeout=self.first_token_spin.value(),
            idle_timeout=self.idle_spin.value(),
            follow_redirects=self.redirects_check.isChecked(),
        )

    def save(self) -> None:
        if self.saving:
            return
        self.banner.clear_message()
        key = self.key_edit.text().strip() or None
        self.saving = True
        self.save_button.setEnabled(False)
        self._bridge.call(
            self._service.routing.add_provider,
            self.config(),
            key,
            on_done=self._on_added,
            on_error=self._on_add_failed,
        )

    # -- slots ---------------------------------------------------------------------------------
    def _on_kind_combo_current_text_changed(self, kind: str) -> None:
        # the preset only fills a URL the user has not typed (empty, or the last preset's)
        current = self.url_edit.text().strip()
        if not current or current == self._preset_url:
            self._preset_url = DEFAULT_URLS.get(kind, "")
            self.url_edit.setText(self._preset_url)

    def _on_name_edit_text_changed(self, text: str) -> None:
        self.prefix_edit.setPlaceholderText(f"{text.strip()}/" if text.strip() else "NAME/")

    def _on_buttons_accepted(self) -> None:
        self.save()

    def _on_added(self, cfg: ProviderConfig) -> None:
        self.saving = False
        self.key_edit.clear()  # the key is never shown again
        self.provider_added.emit(cfg)
        self.accept()

    def _on_add_failed(self, exc: BaseException) -> None:
        self.saving = False
        self.save_button.setEnabled(True)
        text = log_failure(log, "adding a provider failed", exc)
        self.banner.show_message(text, "error")
        self.add_failed.emit(text)


class AliasDialog(QDialog):
    """An alias's name and its ordered targets (the fallback order), picked from the local
    models, the remote models and the other aliases; Up/Down reorder them."""

    alias_saved = Signal(str, object)  # name, tuple of targets
    save_failed = Signal(str)

    def __init__(
        self,
        service: Hearth,
        bridge: Bridge,
        candidates: Sequence[str],
        parent: QWidget | None = None,
        *,
        name: str = "",
        targets: Sequence[str] = (),
    ) -> None:
        super().__init__(parent)
        self._service = service
        self._bridge = bridge
        self.saving = False
        self.setWindowTitle(f"Edit alias {name}" if name else "Add alias")
        self.setModal(True)

        self.name_edit = QLineEdit(name)
        self.name_edit.setPlaceholderText("gpt-4o-mini")
        self.name_edit.setReadOnly(bool(name))  # a rename would leave the old alias behind
        self.candidate_combo = QComboBox()
        self.candidate_combo.setEditable(True)  # a target not listed yet may be typed
        self.candidate_combo.addItems([c for c in candidates if c != name])
        self.candidate_combo.setMinimumContentsLength(30)
        self.add_target_button = QPushButton("Add target")
        self.target_list = QListWidget()
        self.target_list.addItems(list(targets))
        self.up_button = QPushButton("Up")
        self.down_button = QPushButton("Down")
        self.remove_target_button = QPushButton("Remove")
        self.banner = MessageBanner()
        self.buttons = QDialogButtonBox(
            QDialogButtonBox.StandardButton.Save | QDialogButtonBox.StandardButton.Cancel
        )
        self.save_button = self.buttons.button(QDialogButtonBox.StandardButton.Save)

        pick = QHBoxLayout()
        pick.addWidget(self.candidate_combo, 1)
        pick.addWidget(self.add_target_button)
        side = QVBoxLayout()
        side.addWidget(self.up_button)
        side.addWidget(self.down_button)
        side.addWidget(self.remove_target_button)
        side.addStretch(1)
        order = QHBoxLayout()
        order.addWidget(self.target_list, 1)
        order.addLayout(side)
        form = QFormLayout()
        form.addRow("Alias", self.name_edit)
        form.addRow("Target", pick)
        hint = QLabel("Targets are tried in this order; the next one answers when one fails.")
        hint.setStyleSheet("color:#6b6b6b")
        hint.setWordWrap(True)
        layout = QVBoxLayout(self)
        layout.addWidget(self.banner)
        layout.addLayout(form)
        layout.addLayout(order)
        layout.addWidget(hint)
        layout.addWidget(self.buttons)
        self.setMinimumWidth(480)

        self.add_target_button.clicked.connect(self._on_add_target_button_clicked)
        self.up_button.clicked.connect(self._on_up_button_clicked)
        self.down_button.clicked.connect(self._on_down_button_clicked)
        self.remove_target_button.clicked.connect(self._on_remove_target_button_clicked)
        self.buttons.accepted.connect(self._on_buttons_accepted)
        self.buttons.rejected.connect(self.reject)

    def targets(self) -> tuple[str, ...]:
        return tuple(self.target_list.item(i).text() for i in range(self.target_list.count()))

    def add_target(self, target: str) -> bool:
        target = target.strip()
        if not target or target in self.targets():
            return False
        self.target_list.addItem(target)
        self.target_list.setCurrentRow(self.target_list.count() - 1)
        return True

    def move_selected(self, step: int) -> None:
        row = self.target_list.currentRow()
        to = row + step
        if row < 0 or not 0 <= to < self.target_list.count():
            return
        item = self.target_list.takeItem(row)
        self.target_list.insertItem(to, item)
        self.target_list.setCurrentRow(to)

    def save(self) -> None:
        if self.saving:
            return
        self.banner.clear_message()
        self.saving = True
        self.save_button.setEnabled(False)
        name = self.name_edit.text().strip()
        self._bridge.call(
            self._service.routing.set_alias,
            name,
            self.targets(),
            on_done=lambda targets: self._on_saved(name, targets),
            on_error=self._on_save_failed,
        )

    # -- slots ---------------------------------------------------------------------------------
    def _on_add_target_button_clicked(self) -> None:
        self.add_target(self.candidate_combo.currentText())

    def _on_up_button_clicked(self) -> None:
        self.move_selected(-1)

    def _on_down_button_clicked(self) -> None:
        self.move_selected(1)

    def _on_remove_target_button_clicked(self) -> None:
        row = self.target_list.currentRow()
        if row >= 0:
            self.target_list.takeItem(row)

    def _on_buttons_accepted(self) -> None:
        self.save()

    def _on_saved(self, name: str, targets: tuple[str, ...]) -> None:
        self.saving = False
        self.alias_saved.emit(name, targets)
        self.accept()

    def _on_save_failed(self, exc: BaseException) -> None:
        self.saving = False
        self.save_button.setEnabled(True)
        text = log_failure(log, "saving an alias failed", exc)
        self.banner.show_message(text, "error")
        self.save_failed.emit(text)
