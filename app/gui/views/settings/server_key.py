"""Settings' "API key" row: the single server key (``--api-key``'s GUI twin). A new key is shown
once, with Copy; only its hash is stored, at once (not on Save), so a copied key always works.
Tested by tests/gui/views/settings/test_hf_token.py."""

from __future__ import annotations

from dataclasses import replace

from PySide6.QtCore import Signal
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QHBoxLayout, QLabel, QLineEdit, QPushButton, QVBoxLayout, QWidget

from app.gui.bridge import Bridge
from app.settings import Settings, SettingsStore, generate_key, hash_key


class ServerKeyBox(QWidget):
    saved = Signal(object)  # Settings, as written
    message = Signal(str)  # a confirmation for the page's banner
    failed = Signal(object)  # the exception a write raised

    def __init__(self, store: SettingsStore, bridge: Bridge, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._store = store
        self._bridge = bridge
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

        buttons = QHBoxLayout()
        buttons.addWidget(self.key_status_label, 1)
        buttons.addWidget(self.generate_key_button)
        buttons.addWidget(self.clear_key_button)
        new_key_row = QHBoxLayout()
        new_key_row.addWidget(self.new_key_edit, 1)
        new_key_row.addWidget(self.copy_key_button)
        self.new_key_box = QWidget()
        nk = QVBoxLayout(self.new_key_box)
        nk.setContentsMargins(0, 0, 0, 0)
        nk.addLayout(new_key_row)
        nk.addWidget(self.new_key_hint)
        self.new_key_box.hide()
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addLayout(buttons)
        layout.addWidget(self.new_key_box)

        self.generate_key_button.clicked.connect(self._on_generate_key_button_clicked)
        self.clear_key_button.clicked.connect(self._on_clear_key_button_clicked)
        self.copy_key_button.clicked.connect(self._on_copy_key_button_clicked)

    def generate_key(self) -> str:
        """Make a new API key (replacing any other), store its hash now and show it once."""
        key = generate_key()
        self.new_key_edit.setText(key)
        self.new_key_box.show()
        self._write_key_hashes((hash_key(key),), "A new API key is stored. Copy it now.")
        return key

    def clear_key(self) -> None:
        self.new_key_edit.clear()
        self.new_key_box.hide()
        self._write_key_hashes((), "API key removed: the server accepts requests without a key.")

    def show_status(self, s: Settings) -> None:
        n = len(s.server.api_key_hashes)
        self.key_status_label.setText(
            "Not required" if n == 0 else ("Required (1 key)" if n == 1 else f"Required ({n} keys)")
        )
        self.clear_key_button.setEnabled(n > 0)

    def _write_key_hashes(self, hashes: tuple[str, ...], message: str) -> None:
        store = self._store

        def write() -> Settings:
            s = store.load()
            s = replace(s, server=replace(s.server, api_key_hashes=hashes))
            store.save(s)
            return s

        def done(s: Settings) -> None:
            self.show_status(s)
            self.saved.emit(s)
            self.message.emit(message)

        self._bridge.call(write, on_done=done, on_error=self.failed.emit)

    def _on_generate_key_button_clicked(self) -> None:
        self.generate_key()

    def _on_clear_key_button_clicked(self) -> None:
        self.clear_key()

    def _on_copy_key_button_clicked(self) -> None:
        if self.new_key_edit.text():
            QGuiApplication.clipboard().setText(self.new_key_edit.text())
            self.message.emit("Copied the API key to the clipboard.")
