"""The Settings page: server address, API key, HTTPS files, start at launch, models folder, load
defaults, memory budget and how long on-demand loads stay."""

from __future__ import annotations

import logging
from dataclasses import replace

from PySide6.QtCore import Signal
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from app.core.load_options import SPECS
from app.gui.bridge import Bridge, log_failure
from app.gui.views.common import PAGE_MARGINS, MessageBanner, page_title
from app.settings import Settings, SettingsStore, TokenStore, generate_key, hash_key

log = logging.getLogger(__name__)

GIB = 1024**3
THEME_CHOICES = (("system", "Follow the system"), ("light", "Light"), ("dark", "Dark"))
CLOSE_CHOICES = (
    ("ask", "Ask"),
    ("background", "Keep serving in the background"),
    ("quit", "Quit"),
)
PROMPT_CACHE_CHOICES = (
    ("reuse", "Reuse the longest cached prefix"),
    ("exact", "Exact (bit-identical answers)"),
    ("off", "Off"),
)


class SettingsPage(QWidget):
    """Edits a copy of the settings; Save writes it through the SettingsStore."""

    settings_loaded = Signal(object)  # Settings, as read from the file
    settings_saved = Signal(object)  # Settings, as written

    token_changed = Signal(bool)  # a Hugging Face token is set
    theme_chosen = Signal(str)  # ui.theme picked in the combo: apply it at once

    def __init__(
        self,
        store: SettingsStore,
        bridge: Bridge,
        parent: QWidget | None = None,
        *,
        tokens: TokenStore | None = None,
    ) -> None:
        super().__init__(parent)
        self._store = store
        self._tokens = tokens
        self._bridge = bridge
        self.token_set: bool | None = None  # None until the token file has been read
        self.settings: Settings | None = None
        # what the spins showed after reading the file: an untouched spin keeps the exact value
        self._shown_budget = (0.0, 0)  # (spin value, bytes on disk)
        self._shown_ttl = (0, 0)  # (spin value, seconds on disk)

        self.banner = MessageBanner()
        self.host_edit = QLineEdit()
        self.port_spin = QSpinBox()
        self.port_spin.setRange(1, 65535)
        self.start_at_launch_check = QCheckBox("Start the server when Hearth starts")

        self.key_status_label = QLabel()
        self.generate_key_button = QPushButton("Generate new key")
        self.clear_key_button = QPushButton("Remove key")
        self.new_key_edit = QLineEdit()
        self.new_key_edit.setReadOnly(True)
        self.copy_key_button = QPushButton("Copy")
        self.new_key_hint = QLabel(
            "Copy this key now: Hearth keeps only a hash of it and cannot show it again. "
            "Clients send it as <code>Authorization: Bearer KEY</code>."
        )
        self.new_key_hint.setWordWrap(True)
        self.new_key_hint.setStyleSheet("color:#7a4b00")

        # HTTPS: both files or neither; read when the server next starts
        self.tls_cert_edit = QLineEdit()
        self.tls_cert_edit.setPlaceholderText("None: plain HTTP")
        self.tls_cert_button = QPushButton("Browse…")
        self.tls_key_edit = QLineEdit()
        self.tls_key_edit.setPlaceholderText("The certificate's unencrypted private key")
        self.tls_key_button = QPushButton("Browse…")

        self.models_dir_edit = QLineEdit()
        self.models_dir_edit.setPlaceholderText("Default models folder")
        self.browse_button = QPushButton("Browse…")
        self.context_spin = QSpinBox()
        _table_range(self.context_spin, "context_length")
        self.context_spin.setSingleStep(1024)
        self.context_spin.setSpecialValueText("Model default")
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
            "Requests a GGUF model decodes together. They share one KV cache of the context "
            "length (with the exact prompt cache each gets its own, and memory grows with this)."
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
        for w in (
            self.port_spin,
            self.context_spin,
            self.threads_spin,
            self.parallel_spin,
            self.prompt_cache_combo,
            self.budget_spin,
            self.jit_ttl_spin,
        ):
            w.setMinimumWidth(200)
            w.setMaximumWidth(260)
        self.host_edit.setMaximumWidth(320)
        self.save_button = QPushButton("Save")
        self.save_button.setDefault(True)

        # the Hugging Face token: written at once to its own 0600 file, never shown back
        self.token_status_label = QLabel("…")
        self.token_edit = QLineEdit()
        self.token_edit.setEchoMode(QLineEdit.EchoMode.Password)
        self.token_edit.setPlaceholderText("hf_… (for gated and private models)")
        self.token_edit.setMaximumWidth(320)
        self.save_token_button = QPushButton("Set token")
        self.clear_token_button = QPushButton("Clear token")

        server_box = QGroupBox("Server")
        sf = QFormLayout(server_box)
        sf.addRow("Host", self.host_edit)
        sf.addRow("Port", self.port_spin)
        sf.addRow("", self.start_at_launch_check)
        key_buttons = QHBoxLayout()
        key_buttons.addWidget(self.key_status_label, 1)
        key_buttons.addWidget(self.generate_key_button)
        key_buttons.addWidget(self.clear_key_button)
        sf.addRow("API key", key_buttons)
        new_key_row = QHBoxLayout()
        new_key_row.addWidget(self.new_key_edit, 1)
        new_key_row.addWidget(self.copy_key_button)
        self.new_key_box = QWidget()
        nk = QVBoxLayout(self.new_key_box)
        nk.setContentsMargins(0, 0, 0, 0)
        nk.addLayout(new_key_row)
        nk.addWidget(self.new_key_hint)
        self.new_key_box.hide()
        sf.addRow("", self.new_key_box)
        for label, edit, button in (
            ("HTTPS certificate", self.tls_cert_edit, self.tls_cert_button),
            ("HTTPS key", self.tls_key_edit, self.tls_key_button),
        ):
            tls_row = QHBoxLayout()
            tls_row.addWidget(edit, 1)
            tls_row.addWidget(button)
            sf.addRow(label, tls_row)
        server_note = QLabel(
            "Address, key and HTTPS changes apply the next time the server starts."
        )
        server_note.setStyleSheet("color:#6b6b6b")
        sf.addRow("", server_note)

        models_box = QGroupBox("Models")
        mf = QFormLayout(models_box)
        folder_row = QHBoxLayout()
        folder_row.addWidget(self.models_dir_edit, 1)
        folder_row.addWidget(self.browse_button)
        mf.addRow("Models folder", folder_row)
        mf.addRow("Default context length", self.context_spin)
        mf.addRow("Threads", self.threads_spin)
        mf.addRow("Parallel requests", self.parallel_spin)
        mf.addRow("Prompt cache", self.prompt_cache_combo)
        folder_note = QLabel("A new models folder is used after Hearth restarts.")
        folder_note.setStyleSheet("color:#6b6b6b")
        mf.addRow("", folder_note)

        memory_box = QGroupBox("Memory")
        yf = QFormLayout(memory_box)
        yf.addRow("Memory budget", self.budget_spin)
        yf.addRow("Unload on-demand models after", self.jit_ttl_spin)
        yf.addRow("", self.jit_forever_check)
        memory_note = QLabel(
            "On-demand: loaded by an API request. Models you load follow their Load dialog."
        )
        memory_note.setStyleSheet("color:#6b6b6b")
        yf.addRow("", memory_note)

        hub_box = QGroupBox("Hugging Face")
        hf = QFormLayout(hub_box)
        token_status = QHBoxLayout()
        token_status.addWidget(self.token_status_label, 1)
        token_status.addWidget(self.clear_token_button)
        hf.addRow("Access token", token_status)
        token_row = QHBoxLayout()
        token_row.addWidget(self.token_edit, 1)
        token_row.addWidget(self.save_token_button)
        hf.addRow("New token", token_row)
        token_note = QLabel(
            "Stored in a file only you can read; Hearth never shows it again. Create one at "
            "huggingface.co/settings/tokens."
        )
        token_note.setStyleSheet("color:#6b6b6b")
        hf.addRow("", token_note)
        hub_box.setVisible(tokens is not None)

        window_box = self._window_box()

        footer = QHBoxLayout()
        footer.addStretch(1)
        footer.addWidget(self.save_button)

        layout = QVBoxLayout(self)
        layout.setContentsMargins(*PAGE_MARGINS)
        layout.addWidget(page_title("Settings"))
        layout.addWidget(self.banner)
        layout.addWidget(server_box)
        layout.addWidget(models_box)
        layout.addWidget(memory_box)
        layout.addWidget(hub_box)
        layout.addWidget(window_box)
        layout.addStretch(1)
        layout.addLayout(footer)

        self.save_button.clicked.connect(self._on_save_button_clicked)
        self.generate_key_button.clicked.connect(self._on_generate_key_button_clicked)
        self.clear_key_button.clicked.connect(self._on_clear_key_button_clicked)
        self.copy_key_button.clicked.connect(self._on_copy_key_button_clicked)
        self.browse_button.clicked.connect(self._on_browse_button_clicked)
        self.tls_cert_button.clicked.connect(self._on_tls_cert_button_clicked)
        self.tls_key_button.clicked.connect(self._on_tls_key_button_clicked)
        self.jit_forever_check.toggled.connect(self._on_jit_forever_check_toggled)
        self.save_token_button.clicked.connect(self._on_save_token_button_clicked)
        self.clear_token_button.clicked.connect(self._on_clear_token_button_clicked)
        self.token_edit.returnPressed.connect(self._on_save_token_button_clicked)
        self.setEnabled(False)  # until the file has been read
        self.reload()
        self.reload_token()

    def _window_box(self) -> QGroupBox:
        """Theme and what closing the window does: each applied and written at once."""
        self.theme_combo = QComboBox()
        for value, label in THEME_CHOICES:
            self.theme_combo.addItem(label, value)
        self.close_action_combo = QComboBox()
        for value, label in CLOSE_CHOICES:
            self.close_action_combo.addItem(label, value)
        self.close_action_combo.setToolTip(
            "On desktops without a tray icon, while the server runs. With a tray, closing the "
            "window keeps Hearth in the tray."
        )
        box = QGroupBox("Window")
        wf = QFormLayout(box)
        wf.addRow("Theme", self.theme_combo)
        wf.addRow("Closing the window while serving", self.close_action_combo)
        self.theme_combo.activated.connect(self._on_theme_combo_activated)
        self.close_action_combo.activated.connect(self._on_close_action_combo_activated)
        return box

    def set_ui(self, **changes: str) -> None:
        """Write ``ui`` fields (theme, close_action) now, keeping the rest as on disk."""

        def write() -> Settings:
            return self._store.update_ui(**changes)

        def done(s: Settings) -> None:
            self.settings = s

        self._bridge.call(write, on_done=done, on_error=self._show_error)

    def _on_theme_combo_activated(self, _index: int) -> None:
        theme = str(self.theme_combo.currentData())
        self.theme_chosen.emit(theme)
        self.set_ui(theme=theme)

    def _on_close_action_combo_activated(self, _index: int) -> None:
        self.set_ui(close_action=str(self.close_action_combo.currentData()))

    # -- actions -------------------------------------------------------------------------------------
    def reload(self) -> None:
        self._bridge.call(
            self._store.load, on_done=self._on_store_loaded, on_error=self._show_error
        )

    def save(self) -> None:
        """Write the form through the store; fields this page does not show are kept as on disk."""
        if not self.host_edit.text().strip():
            self.banner.show_message("The server host cannot be empty.", "error")
            return
        host = self.host_edit.text().strip()
        port = self.port_spin.value()
        tls_cert, tls_key = self.tls_cert_edit.text().strip(), self.tls_key_edit.text().strip()
        if bool(tls_cert) != bool(tls_key):
            self.banner.show_message("HTTPS needs both a certificate and a key file.", "error")
            return
        start = self.start_at_launch_check.isChecked()
        models_dir = self.models_dir_edit.text().strip()
        context, threads = self.context_spin.value(), self.threads_spin.value()
        parallel = self.parallel_spin.value()
        cache_mode = str(self.prompt_cache_combo.currentData())
        budget = self._budget_bytes()
        jit_ttl = self._jit_ttl_seconds()
        forever = self.jit_forever_check.isChecked()

        def write() -> Settings:
            # read-modify-write on the loop thread so concurrent changes to other fields survive
            s = self._store.load()
            s = replace(
                s,
                server=replace(
                    s.server,
                    host=host,
                    port=port,
                    start_at_launch=start,
                    tls_cert=tls_cert,
                    tls_key=tls_key,
                ),
                load=replace(
                    s.load,
                    context_length=context,
                    threads=threads,
                    parallel=parallel,
                    memory_budget_bytes=budget,
                    jit_ttl_s=jit_ttl,
                    jit_keep_forever=forever,
                ),
                prompt_cache=replace(s.prompt_cache, mode=cache_mode),
                models_dir=models_dir,
            )
            self._store.save(s)
            return s

        self._bridge.call(write, on_done=self._on_store_saved, on_error=self._show_error)

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

    def generate_key(self) -> str:
        """Make a new API key (replacing any other), store its hash now and show it once."""
        key = generate_key()
        digest = hash_key(key)
        self.new_key_edit.setText(key)
        self.new_key_box.show()
        self._write_key_hashes((digest,), "A new API key is stored. Copy it now.")
        return key

    def clear_key(self) -> None:
        self.new_key_edit.clear()
        self.new_key_box.hide()
        self._write_key_hashes((), "API key removed: the server accepts requests without a key.")

    def _write_key_hashes(self, hashes: tuple[str, ...], message: str) -> None:
        # keys are written at once (not on Save) so a key the user copied always works
        def write() -> Settings:
            s = self._store.load()
            s = replace(s, server=replace(s.server, api_key_hashes=hashes))
            self._store.save(s)
            return s

        def done(s: Settings) -> None:
            self.settings = s
            self._show_key_status(s)
            self.banner.show_message(message)

        self._bridge.call(write, on_done=done, on_error=self._show_error)

    # -- slots ---------------------------------------------------------------------------------------
    def _on_save_button_clicked(self) -> None:
        self.save()

    def _on_save_token_button_clicked(self) -> None:
        text = self.token_edit.text().strip()
        if text:
            self.set_token(text)

    def _on_clear_token_button_clicked(self) -> None:
        self.set_token(None)

    def _on_generate_key_button_clicked(self) -> None:
        self.generate_key()

    def _on_clear_key_button_clicked(self) -> None:
        self.clear_key()

    def _on_copy_key_button_clicked(self) -> None:
        if self.new_key_edit.text():
            QGuiApplication.clipboard().setText(self.new_key_edit.text())
            self.banner.show_message("Copied the API key to the clipboard.")

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

    def _on_jit_forever_check_toggled(self, forever: bool) -> None:
        self.jit_ttl_spin.setEnabled(not forever)

    def _on_store_loaded(self, s: Settings) -> None:
        self.settings = s
        self.host_edit.setText(s.server.host)
        self.port_spin.setValue(s.server.port)
        self.start_at_launch_check.setChecked(s.server.start_at_launch)
        self.tls_cert_edit.setText(s.server.tls_cert)
        self.tls_key_edit.setText(s.server.tls_key)
        self.models_dir_edit.setText(s.models_dir)
        self.context_spin.setValue(s.load.context_length)
        self.threads_spin.setValue(s.load.threads)
        self.parallel_spin.setValue(s.load.parallel)
        self.prompt_cache_combo.setCurrentIndex(
            max(0, self.prompt_cache_combo.findData(s.prompt_cache.mode))
        )
        self.budget_spin.setValue(s.load.memory_budget_bytes / GIB)
        self._shown_budget = (self.budget_spin.value(), s.load.memory_budget_bytes)
        self.jit_ttl_spin.setValue(round(s.load.jit_ttl_s / 60))
        self._shown_ttl = (self.jit_ttl_spin.value(), s.load.jit_ttl_s)
        self.jit_forever_check.setChecked(s.load.jit_keep_forever)
        self.jit_ttl_spin.setEnabled(not s.load.jit_keep_forever)
        self._show_key_status(s)
        self.theme_combo.setCurrentIndex(max(0, self.theme_combo.findData(s.ui.theme)))
        self.close_action_combo.setCurrentIndex(
            max(0, self.close_action_combo.findData(s.ui.close_action))
        )
        self.setEnabled(True)
        self.settings_loaded.emit(s)

    def _on_store_saved(self, s: Settings) -> None:
        self.settings = s
        self.banner.show_message("Settings saved.")
        self.settings_saved.emit(s)

    def _budget_bytes(self) -> int:
        shown, on_disk = self._shown_budget
        value = self.budget_spin.value()
        return on_disk if value == shown else round(value * GIB)

    def _jit_ttl_seconds(self) -> int:
        shown, on_disk = self._shown_ttl
        value = self.jit_ttl_spin.value()
        return on_disk if value == shown else value * 60

    def _show_error(self, exc: BaseException) -> None:
        self.banner.show_message(log_failure(log, "settings", exc), "error")

    def _show_token_status(self, is_set: bool) -> None:
        self.token_set = is_set
        self.token_status_label.setText("Set" if is_set else "Not set")
        self.clear_token_button.setEnabled(is_set)
        self.token_changed.emit(is_set)

    def _show_key_status(self, s: Settings) -> None:
        n = len(s.server.api_key_hashes)
        self.key_status_label.setText(
            "Not required" if n == 0 else ("Required (1 key)" if n == 1 else f"Required ({n} keys)")
        )
        self.clear_key_button.setEnabled(n > 0)


def _table_range(spin: QSpinBox, option: str) -> None:
    """The load option table's range (the settings file is validated against the same)."""
    spec = SPECS[option]
    spin.setRange(int(spec.minimum or 0), int(min(spec.maximum or 2**31 - 1, 2**31 - 1)))
