"""The Server page's response cache: its mode, TTL, entry bound, semantic threshold
and embedding model (the ``cache`` settings), the hit/miss counts, and a Clear button. Reads and
writes go through the settings store and the cache's SQLite file on the loop thread (the GUI
thread never touches files); a running server uses a saved change at its next request."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

from PySide6.QtGui import QShowEvent
from PySide6.QtWidgets import (
    QComboBox,
    QDoubleSpinBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from app.core.gateway.cache.store import CACHE_MODES, CacheConfig, CacheStore
from app.gui.bridge import Bridge, log_failure
from app.gui.views.common import MessageBanner
from app.settings import SettingsStore

log = logging.getLogger(__name__)


class CacheSection(QWidget):
    def __init__(
        self,
        settings: SettingsStore,
        db: Path,
        bridge: Bridge,
        parent: QWidget | None = None,
    ) -> None:
        super().__init__(parent)
        self._settings = settings
        self._store = CacheStore(db)
        self._bridge = bridge
        self.mode_combo = QComboBox()
        self.mode_combo.addItems(list(CACHE_MODES))
        self.mode_combo.setToolTip(
            "exact: identical deterministic requests; semantic: also a near-identical last "
            "user message (needs an embedding model)"
        )
        self.ttl_spin = QSpinBox()
        self.ttl_spin.setRange(1, 365 * 24 * 3600)
        self.ttl_spin.setSuffix(" s")
        self.max_spin = QSpinBox()
        self.max_spin.setRange(1, 10_000_000)
        self.threshold_spin = QDoubleSpinBox()
        self.threshold_spin.setRange(0.01, 1.0)
        self.threshold_spin.setSingleStep(0.01)
        self.threshold_spin.setDecimals(2)
        self.embedding_edit = QLineEdit()
        self.embedding_edit.setPlaceholderText("embedding model id (semantic mode)")
        self.save_button = QPushButton("Save")
        self.clear_button = QPushButton("Clear")
        self.counts_label = QLabel("")
        self.banner = MessageBanner()

        form = QFormLayout()
        form.addRow("Mode", self.mode_combo)
        form.addRow("Time to live", self.ttl_spin)
        form.addRow("Max entries", self.max_spin)
        form.addRow("Semantic threshold", self.threshold_spin)
        form.addRow("Embedding model", self.embedding_edit)
        buttons = QHBoxLayout()
        buttons.addWidget(self.counts_label, 1)
        buttons.addWidget(self.save_button)
        buttons.addWidget(self.clear_button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(QLabel("Response cache"))
        layout.addWidget(self.banner)
        layout.addLayout(form)
        layout.addLayout(buttons)

        self.save_button.clicked.connect(self._on_save_button_clicked)
        self.clear_button.clicked.connect(self._on_clear_button_clicked)
        self.refresh()

    # -- reading ------------------------------------------------------------------------------
    def refresh(self) -> None:
        """The saved settings into the fields, and the counts."""
        self._bridge.call(self._read, on_done=self._show, on_error=self._failed("reading"))

    def refresh_counts(self) -> None:
        self._bridge.call(self._store.stats, on_done=self._show_counts)

    def showEvent(self, event: QShowEvent) -> None:  # noqa: N802 - Qt's name
        super().showEvent(event)
        self.refresh_counts()  # the counts as of now whenever the page comes into view

    def _read(self) -> tuple[CacheConfig, dict[str, int]]:
        return self._settings.load().cache, self._store.stats()

    def _show(self, result: tuple[CacheConfig, dict[str, int]]) -> None:
        cfg, counts = result
        self.mode_combo.setCurrentText(cfg.mode)
        self.ttl_spin.setValue(round(cfg.ttl_s))
        self.max_spin.setValue(cfg.max_entries)
        self.threshold_spin.setValue(cfg.semantic_threshold)
        self.embedding_edit.setText(cfg.embedding_model)
        self._show_counts(counts)

    def _show_counts(self, c: dict[str, int]) -> None:
        self.counts_label.setText(
            f"{c['entries']} entries · {c['hits']} hits · {c['semantic_hits']} semantic · "
            f"{c['misses']} misses · {c['bypasses']} bypassed"
        )

    def _failed(self, what: str) -> Any:
        def show(exc: BaseException) -> None:
            self.banner.show_message(log_failure(log, f"{what} the response cache", exc), "error")

        return show

    # -- writing ------------------------------------------------------------------------------
    def config(self) -> CacheConfig:
        """What the fields say."""
        return CacheConfig(
            mode=self.mode_combo.currentText(),
            max_entries=self.max_spin.value(),
            ttl_s=float(self.ttl_spin.value()),
            semantic_threshold=round(self.threshold_spin.value(), 2),
            embedding_model=self.embedding_edit.text().strip(),
        )

    def _on_save_button_clicked(self) -> None:
        cfg = self.config()

        def write() -> None:
            # cache.scope has no field here: the file's choice is kept
            scope = self._settings.load().cache.scope
            self._settings.update(cache=dataclasses.replace(cfg, scope=scope))

        self._bridge.call(
            write,
            on_done=lambda _: self.banner.show_message("Response cache settings saved", "info"),
            on_error=self._failed("saving"),
        )

    def _on_clear_button_clicked(self) -> None:
        def clear() -> dict[str, int]:
            self._store.clear()
            return self._store.stats()

        self._bridge.call(clear, on_done=self._show_counts, on_error=self._failed("clearing"))
