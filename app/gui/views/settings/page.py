"""The Settings page: server address (shown; edited on the Server page), HTTPS files, start at
launch, models folder, load defaults, memory budget, on-demand loading and how long on-demand
loads stay, the window's theme and close behaviour, logs. Every value waits for Apply (one
model: form.py); leaving with unsaved changes asks first (``confirm_leave``)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt, QUrl, Signal
from PySide6.QtGui import QDesktopServices, QShowEvent
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFileDialog,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QMessageBox,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from app.core.desktop.autostart import Autostart
from app.core.engine.load_options import SPECS
from app.core.library import fit
from app.core.library.fit import default_budget
from app.gui.bridge import Bridge, log_failure
from app.gui.units import human_bytes
from app.gui.views.common import PAGE_MARGINS, MessageBanner, guard_wheel, page_title
from app.gui.views.settings.autostart_check import StartAtLoginCheck
from app.gui.views.settings.fields import add_fields
from app.gui.views.settings.form import SettingsForm, note_label, settings_form, unsaved_dialog
from app.gui.views.settings.logs import LogsBox
from app.gui.views.settings.mcp_servers import McpServersBox
from app.gui.views.settings.runtime_info import RuntimeBox
from app.gui.views.settings.window import WindowBox
from app.settings import (
    ServerSettings,
    Settings,
    SettingsStore,
    TokenStore,
)

log = logging.getLogger(__name__)

PROMPT_CACHE_CHOICES = (
    ("reuse", "Reuse the longest cached prefix"),
    ("exact", "Exact (bit-identical answers)"),
    ("off", "Off"),
)


class SettingsPage(QWidget):
    """Edits the settings; Apply writes the changed values through the SettingsStore, Revert
    shows the file's values again."""

    settings_loaded = Signal(object)  # Settings, as read from the file
    settings_saved = Signal(object)  # Settings, as written by Apply
    unsaved_changed = Signal(bool)  # the page has (True) or no longer has unsaved changes

    token_changed = Signal(bool)  # a Hugging Face token is set
    server_page_requested = Signal()  # "Change on the Server page": the address is edited there
    auto_budget_shown = Signal(str)  # the Auto memory budget's text, with this machine's figure
    theme_chosen = Signal(str)  # ui.theme, once applied: the window restyles

    def __init__(
        self,
        store: SettingsStore,
        bridge: Bridge,
        *,
        tokens: TokenStore | None = None,
        runtime_report: Callable[[], dict[str, Any]] | None = None,
        default_models_dir: Path | None = None,
        auto_budget: Callable[[], str] | None = None,
        autostart: Autostart | None = None,
        mcp: Any = None,
    ) -> None:
        super().__init__()  # its parent is the window's page stack
        self._store = store
        # the folder an empty ``models_dir`` means, shown as itself rather than a placeholder
        self._default_models_dir = default_models_dir
        self._tokens = tokens
        self._bridge = bridge
        self.token_set: bool | None = None  # None until the token file has been read
        self.settings: Settings | None = None
        self.form = SettingsForm(self)
        self.leave_dialog: QMessageBox | None = None  # open while ask_leave asks

        self.banner = MessageBanner()
        # host/port are edited in one place, the Server page; here they are only shown
        self.address_label = QLabel("…")
        self.address_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.change_address_button = QPushButton("Change on the Server page")
        self.start_at_launch_check = QCheckBox("Start the server when Hearth starts")
        # the OS autostart, applied at once (not by Apply); None: not offered
        self.start_at_login_check = (
            StartAtLoginCheck(autostart, store, bridge) if autostart is not None else None
        )
        self.keys_label = note_label("API keys are on the Server page.")
        # HTTPS: both files or neither; read when the server next starts
        self.tls_cert_edit = QLineEdit()
        self.tls_cert_edit.setPlaceholderText("None: plain HTTP")
        self.tls_cert_button = QPushButton("Browse…")
        self.tls_key_edit = QLineEdit()
        self.tls_key_edit.setPlaceholderText("The certificate's unencrypted private key")
        self.tls_key_button = QPushButton("Browse…")

        self.models_dir_edit = QLineEdit()
        self.browse_button = QPushButton("Change…")
        self.open_models_button = QPushButton("Open")
        self.open_models_button.setToolTip("Show the models folder in the file manager")
        self.context_spin = QSpinBox()
        _table_range(self.context_spin, "context_length")
        self.context_spin.setSingleStep(1024)
        self.context_spin.setSpecialValueText("Auto (fits memory)")
        self.context_spin.setToolTip(
            "Auto: the model's trained length, or the most that fits the memory budget free at "
            "load time, up to the cap below. A number is used as it is."
        )
        self.max_auto_context_spin = QSpinBox()
        self.max_auto_context_spin.setRange(256, 1 << 22)
        self.max_auto_context_spin.setSingleStep(4096)
        self.max_auto_context_spin.setSuffix(" tokens")
        self.max_auto_context_spin.setToolTip("The largest context an auto load picks")
        self.threads_spin = QSpinBox()
        _table_range(self.threads_spin, "threads")
        self.threads_spin.setSpecialValueText("Auto (follows the load)")
        self.budget_spin = QDoubleSpinBox()
        self.budget_spin.setRange(0, 4096)
        self.budget_spin.setDecimals(1)
        self.budget_spin.setSingleStep(0.5)
        self.parallel_spin = QSpinBox()
        _table_range(self.parallel_spin, "parallel")
        self.parallel_spin.setToolTip(
            "The most requests a GGUF model decodes together. They share one KV cache of the "
            "context length; on the CPU, more than 4 join only while their prompts are short "
            "enough for that to be faster (with the exact prompt cache each gets its own, and "
            "memory grows with this)."
        )
        self.prompt_cache_combo = QComboBox()
        for mode, label in PROMPT_CACHE_CHOICES:
            self.prompt_cache_combo.addItem(label, mode)
        self.prompt_cache_combo.setToolTip(
            "Reuse: a request continues from the longest cached prefix (earlier turns and their "
            "answers, several conversations). Exact: reuse only what keeps answers and seeds "
            "bit-identical to an uncached run. Off: no reuse."
        )
        self.budget_spin.setSuffix(" GiB")
        self.budget_spin.setSpecialValueText("Auto (80% of RAM or VRAM)")
        self.budget_spin.setToolTip(
            "Loaded models share this much memory: loading past it unloads idle models first"
        )
        self.jit_ttl_spin = QSpinBox()
        self.jit_ttl_spin.setRange(0, 7 * 24 * 60)
        self.jit_ttl_spin.setSuffix(" min idle")
        self.jit_ttl_spin.setSpecialValueText("As soon as idle")
        self.jit_forever_check = QCheckBox("Keep on-demand models loaded forever")
        self.jit_loading_check = QCheckBox(
            "Load a model on demand when a request names one that is not loaded"
        )
        self.jit_loading_check.setToolTip(
            "Off: requests for a model that is not loaded are refused (404) until you load it."
        )
        for w in (
            self.context_spin,
            self.max_auto_context_spin,
            self.threads_spin,
            self.parallel_spin,
            self.prompt_cache_combo,
            self.budget_spin,
            self.jit_ttl_spin,
        ):
            w.setMaximumWidth(320)  # shrinks with a narrow window; no fixed minimum

        # the Hugging Face token: written at once to its own 0600 file, never shown back
        self.token_status_label = QLabel("…")
        self.token_edit = QLineEdit()
        self.token_edit.setEchoMode(QLineEdit.EchoMode.Password)
        self.token_edit.setPlaceholderText("hf_… (for gated and private models)")
        self.token_edit.setMaximumWidth(320)
        self.save_token_button = QPushButton("Set token")
        self.clear_token_button = QPushButton("Clear token")

        server_box = QGroupBox("Server")
        sf = settings_form(server_box)
        address_row = QHBoxLayout()
        address_row.addWidget(self.address_label, 1)
        address_row.addWidget(self.change_address_button)
        sf.addRow("Address", address_row)
        sf.addRow("", self.start_at_launch_check)
        if self.start_at_login_check is not None:
            sf.addRow("", self.start_at_login_check)
            self.start_at_login_check.failed.connect(self._on_start_at_login_failed)
        sf.addRow("API keys", self.keys_label)
        for label, edit, button in (
            ("HTTPS certificate", self.tls_cert_edit, self.tls_cert_button),
            ("HTTPS key", self.tls_key_edit, self.tls_key_button),
        ):
            tls_row = QHBoxLayout()
            tls_row.addWidget(edit, 1)
            tls_row.addWidget(button)
            sf.addRow(label, tls_row)
        sf.addRow("", note_label("HTTPS changes apply the next time the server starts."))

        models_box = QGroupBox("Models")
        mf = settings_form(models_box)
        folder_row = QHBoxLayout()
        folder_row.addWidget(self.models_dir_edit, 1)
        folder_row.addWidget(self.open_models_button)
        folder_row.addWidget(self.browse_button)
        mf.addRow("Models folder", folder_row)
        mf.addRow("Default context length", self.context_spin)
        mf.addRow("Auto context at most", self.max_auto_context_spin)
        mf.addRow("Threads", self.threads_spin)
        mf.addRow("Parallel requests", self.parallel_spin)
        mf.addRow("Prompt cache", self.prompt_cache_combo)
        mf.addRow("", note_label("A new models folder is used after Hearth restarts."))

        memory_box = QGroupBox("Memory")
        yf = settings_form(memory_box)
        yf.addRow("Memory budget", self.budget_spin)
        yf.addRow("On-demand loading", self.jit_loading_check)
        yf.addRow("Unload on-demand models after", self.jit_ttl_spin)
        yf.addRow("", self.jit_forever_check)
        yf.addRow(
            "",
            note_label(
                "On-demand: loaded by an API request (switching it applies to the running "
                "server once applied). Models you load follow their Load dialog."
            ),
        )

        hub_box = QGroupBox("Hugging Face")
        hf = settings_form(hub_box)
        token_status = QHBoxLayout()
        token_status.addWidget(self.token_status_label, 1)
        token_status.addWidget(self.clear_token_button)
        hf.addRow("Access token", token_status)
        token_row = QHBoxLayout()
        token_row.addWidget(self.token_edit, 1)
        token_row.addWidget(self.save_token_button)
        hf.addRow("New token", token_row)
        hf.addRow(
            "",
            note_label(
                "Stored in a file only you can read; Hearth never shows it again. Create one "
                "at huggingface.co/settings/tokens."
            ),
        )
        hub_box.setVisible(tokens is not None)

        self.window_box = WindowBox()  # theme and what closing does
        self.theme_combo = self.window_box.theme_combo
        self.close_action_combo = self.window_box.close_combo
        self.logs_box = LogsBox()  # recording request text, the logs folder
        self.logs_box.open_failed.connect(self._on_logs_box_open_failed)
        self.record_content_check = self.logs_box.record_check

        # Apply / Revert, with the page's unsaved state beside them
        self.unsaved_label = QLabel("Unsaved changes")
        self.unsaved_label.setStyleSheet("color:#9a5b00; font-weight:bold")
        self.unsaved_label.hide()
        self.revert_button = QPushButton("Revert")
        self.revert_button.setToolTip("Show the saved settings again")
        self.apply_button = QPushButton("Apply")
        self.apply_button.setDefault(True)
        footer = QHBoxLayout()
        footer.addWidget(self.unsaved_label)
        footer.addStretch(1)
        footer.addWidget(self.revert_button)
        footer.addWidget(self.apply_button)

        layout = QVBoxLayout(self)
        layout.setContentsMargins(*PAGE_MARGINS)
        layout.addWidget(page_title("Settings"))
        layout.addWidget(self.banner)
        for box in (server_box, models_box, memory_box, hub_box, self.window_box, self.logs_box):
            layout.addWidget(box)
        self.mcp_box = McpServersBox(bridge, mcp)  # mcp.json, status, Restart
        layout.addWidget(self.mcp_box)
        # the doctor's report; absent where the page is built without a service
        self.runtime_box = RuntimeBox(bridge, runtime_report) if runtime_report else None
        if self.runtime_box is not None:
            layout.addWidget(self.runtime_box)  # it checks when first shown
        layout.addStretch(1)
        layout.addLayout(footer)
        add_fields(self.form, {
            "start_at_launch": self.start_at_launch_check, "tls_cert": self.tls_cert_edit,
            "tls_key": self.tls_key_edit, "jit_loading": self.jit_loading_check,
            "models_dir": self.models_dir_edit, "context_length": self.context_spin,
            "max_auto_context": self.max_auto_context_spin, "threads": self.threads_spin,
            "parallel": self.parallel_spin, "prompt_cache": self.prompt_cache_combo,
            "memory_budget": self.budget_spin, "jit_ttl": self.jit_ttl_spin,
            "jit_keep_forever": self.jit_forever_check, "theme": self.theme_combo,
            "close_action": self.close_action_combo, "log_content": self.record_content_check,
        }, str(self._default_models_dir or ""))  # fmt: skip
        guard_wheel(self)  # scrolling the page never changes a value

        self.apply_button.clicked.connect(self._on_apply_button_clicked)
        self.revert_button.clicked.connect(self._on_revert_button_clicked)
        self.form.dirty_changed.connect(self._on_form_dirty_changed)
        self.browse_button.clicked.connect(self._on_browse_button_clicked)
        self.open_models_button.clicked.connect(self._on_open_models_button_clicked)
        self.change_address_button.clicked.connect(self.server_page_requested)
        self.tls_cert_button.clicked.connect(self._on_tls_cert_button_clicked)
        self.tls_key_button.clicked.connect(self._on_tls_key_button_clicked)
        self.jit_forever_check.toggled.connect(self._on_jit_forever_check_toggled)
        self.save_token_button.clicked.connect(self._on_save_token_button_clicked)
        self.clear_token_button.clicked.connect(self._on_clear_token_button_clicked)
        self.token_edit.returnPressed.connect(self._on_save_token_button_clicked)
        self._on_form_dirty_changed(False)
        self.setEnabled(False)  # until the file has been read
        self.reload()
        self.reload_token()
        # this machine's figure for "Auto" (reads /proc/meminfo: on the loop thread)
        self._bridge.call(auto_budget or auto_budget_text, on_done=self._show_auto_budget)

    # -- actions -------------------------------------------------------------------------------------
    @property
    def unsaved(self) -> bool:
        """Whether a value on the page differs from the settings it was shown from."""
        return self.form.dirty

    def reload(self) -> None:
        """Read the file again: untouched values show it, values being edited are kept."""
        self._bridge.call(
            self._store.load, on_done=self._on_store_loaded, on_error=self._show_error
        )

    def apply(self) -> bool:
        """Write the changed values (read-modify-write: fields this page did not change are kept
        as on disk). Returns False when a value is refused (shown in the banner)."""
        tls_cert, tls_key = self.tls_cert_edit.text().strip(), self.tls_key_edit.text().strip()
        if bool(tls_cert) != bool(tls_key):
            self.banner.show_message("HTTPS needs both a certificate and a key file.", "error")
            return False
        store, form = self._store, self.form
        self._bridge.call(
            lambda: store.change(form.apply_to),  # the file as it is now, plus our changes
            on_done=self._on_store_saved,
            on_error=self._show_error,
        )
        return True

    def revert(self) -> None:
        """Show the saved settings again, dropping unsaved changes."""
        if self.form.shown_from is not None:
            self.form.show(self.form.shown_from)
        self.reload()

    def ask_leave(self, then: Callable[[], object]) -> bool:
        """Before the page (or the window) is left. Nothing unsaved: True (leave now). Else
        False, and Apply / Discard / Cancel is asked without blocking: ``then()`` runs after
        Apply or Discard; Cancel stays. Never modal-blocking, so nothing waits on the answer."""
        if not self.form.dirty:
            return True
        if self.leave_dialog is not None:  # already asking
            self.leave_dialog.raise_()
            return False
        dialog = unsaved_dialog(self)
        self.leave_dialog = dialog

        def answered(_result: int) -> None:
            self.leave_dialog = None
            clicked = dialog.clickedButton()
            role = dialog.buttonRole(clicked) if clicked is not None else None
            dialog.deleteLater()
            if role == QMessageBox.ButtonRole.AcceptRole:  # leave once it is written

                def saved(*_: object) -> None:
                    self.settings_saved.disconnect(saved)
                    then()

                self.settings_saved.connect(saved)
                if not self.apply():  # refused (the banner says why): stay
                    self.settings_saved.disconnect(saved)
            elif role == QMessageBox.ButtonRole.DestructiveRole:
                self.revert()
                then()

        dialog.finished.connect(answered)
        dialog.open()
        return False

    def set_token(self, token: str | None) -> None:
        """Store the Hugging Face token (None or empty: forget it) on the loop thread."""
        tokens = self._tokens
        if tokens is None:
            return
        self.token_edit.clear()  # the text is not kept in the widget once handed over

        def write() -> bool:
            tokens.save(token)
            return tokens.load() is not None

        def done(is_set: bool) -> None:
            self._show_token_status(is_set)
            self.banner.show_message(
                "Hugging Face token saved." if is_set else "Hugging Face token removed."
            )

        self._bridge.call(write, on_done=done, on_error=self._show_error)

    def reload_token(self) -> None:
        tokens = self._tokens
        if tokens is not None:
            self._bridge.call(
                lambda: tokens.load() is not None,
                on_done=self._show_token_status,
                on_error=self._show_error,
            )

    def showEvent(self, e: QShowEvent) -> None:  # noqa: N802 - Qt override
        super().showEvent(e)
        if self.settings is not None:
            self.reload()  # the close dialog, the welcome or the CLI may have changed the file

    def show_saved_ui(self, *, close_action: str) -> None:
        """``ui.close_action`` as another part of the window has just written (the close dialog's "Don't
        ask again", the welcome's tray switch): shown as saved, unsaved edits kept."""
        if self.settings is not None:
            ui = replace(self.settings.ui, close_action=close_action)
            self.settings = replace(self.settings, ui=ui)
            self.form.merge(self.settings)

    def show_address(self, server: ServerSettings) -> None:
        """The address the server starts on (set on the Server page)."""
        port = str(server.port) if server.port else "any free port"
        self.address_label.setText(f"{server.host}, port {port}")

    # -- slots ---------------------------------------------------------------------------------------
    def _on_apply_button_clicked(self) -> None:
        self.apply()

    def _on_revert_button_clicked(self) -> None:
        self.revert()

    def _on_form_dirty_changed(self, dirty: bool) -> None:
        self.unsaved_label.setVisible(dirty)
        self.revert_button.setEnabled(dirty)
        self.unsaved_changed.emit(dirty)

    def _on_save_token_button_clicked(self) -> None:
        text = self.token_edit.text().strip()
        if text:
            self.set_token(text)

    def _on_clear_token_button_clicked(self) -> None:
        self.set_token(None)

    def _on_logs_box_open_failed(self, text: str) -> None:
        self.banner.show_message(text, "error")

    def _on_open_models_button_clicked(self) -> None:
        folder = Path(self.models_dir_edit.text().strip() or self._default_models_dir or "")
        if not str(folder) or str(folder) == ".":
            return

        def opened(ok: bool) -> None:
            if not ok:
                self.banner.show_message(f"Could not open {folder}.", "error")

        def make() -> Path:
            folder.mkdir(parents=True, exist_ok=True)  # a fresh install has none yet
            return folder

        self._bridge.call(
            make,
            on_done=lambda p: opened(QDesktopServices.openUrl(QUrl.fromLocalFile(str(p)))),
            on_error=self._show_error,
        )

    def _on_browse_button_clicked(self) -> None:
        folder = QFileDialog.getExistingDirectory(
            self, "Models folder", self.models_dir_edit.text()
        )
        if folder:
            self.models_dir_edit.setText(folder)

    def _on_tls_cert_button_clicked(self) -> None:
        self._browse_file(self.tls_cert_edit, "HTTPS certificate (PEM)")

    def _on_tls_key_button_clicked(self) -> None:
        self._browse_file(self.tls_key_edit, "HTTPS private key (PEM)")

    def _browse_file(self, edit: QLineEdit, title: str) -> None:
        path, _ = QFileDialog.getOpenFileName(
            self, title, edit.text(), "PEM files (*.pem *.crt *.key);;All files (*)"
        )
        if path:
            edit.setText(path)

    def _on_start_at_login_failed(self, text: str) -> None:
        self.banner.show_message(text, "error")

    def _on_jit_forever_check_toggled(self, forever: bool) -> None:
        self.jit_ttl_spin.setEnabled(not forever)

    def _on_store_loaded(self, s: Settings) -> None:
        first = self.settings is None
        self.settings = s
        self.show_address(s.server)
        if not first:  # read again on show: only this page's fields follow the file
            self.form.merge(s)
            return
        self.form.show(s)
        self.jit_ttl_spin.setEnabled(not self.jit_forever_check.isChecked())
        self.setEnabled(True)
        self.settings_loaded.emit(s)

    def _on_store_saved(self, s: Settings) -> None:
        theme_changed = self.settings is None or self.settings.ui.theme != s.ui.theme
        self.settings = s
        self.form.show(s)
        self.banner.show_message("Settings saved.")
        if theme_changed:
            self.theme_chosen.emit(s.ui.theme)
        self.settings_saved.emit(s)

    def _show_auto_budget(self, text: str) -> None:
        self.budget_spin.setSpecialValueText(text)
        self.budget_spin.setToolTip(
            f"{text}. Loaded models share this much memory: loading past it unloads idle "
            "models first"
        )
        self.auto_budget_shown.emit(text)

    def _show_error(self, exc: BaseException) -> None:
        self.banner.show_message(log_failure(log, "settings", exc), "error")

    def _show_token_status(self, is_set: bool) -> None:
        self.token_set = is_set
        self.token_status_label.setText("Set" if is_set else "Not set")
        self.clear_token_button.setEnabled(is_set)
        self.token_changed.emit(is_set)


def _table_range(spin: QSpinBox, option: str) -> None:
    """The load option table's range (the settings file is validated against the same)."""
    spec = SPECS[option]
    spin.setRange(int(spec.minimum or 0), int(min(spec.maximum or 2**31 - 1, 2**31 - 1)))


def auto_budget_text() -> str:
    """What the Auto memory budget is on this machine, e.g. "Auto — 80% of RAM, 12.5 GiB"."""
    mem = fit.probe_memory()
    gpu = max((free for _, free in mem.gpus), default=0)
    where = "VRAM" if gpu > mem.ram_total else "RAM"
    return f"Auto — 80% of {where}, {human_bytes(default_budget())}"
