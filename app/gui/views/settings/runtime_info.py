"""The Settings page's "Runtime" section: the same report as ``hearth doctor``."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication, QShowEvent
from PySide6.QtWidgets import (
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app import __version__
from app.core.desktop import doctor
from app.core.engine.models import speech_models
from app.gui.bridge import Bridge, log_failure
from app.gui.views.chat.dictation import can_record

log = logging.getLogger(__name__)


def report_source(ctx: Any) -> Callable[[], dict[str, Any]]:
    """The doctor's report for the running app (``ctx``: GuiContext); blocking: call it off the
    GUI thread (it may run ``nvidia-smi``)."""
    from app.core.library.fit import default_budget

    def collect() -> dict[str, Any]:
        s = ctx.settings_store.load()
        url = ctx.server.base_url
        srv = s.server
        configured = f"{'https' if srv.tls_cert else 'http'}://{srv.host}:{srv.port}"
        return doctor.collect(
            ctx.service.runtimes,
            version=__version__,
            paths=ctx.paths,
            models_dir=s.models_dir,
            budget_bytes=s.load.memory_budget_bytes or default_budget(),
            server={"url": url.removesuffix("/v1") if url else configured, "running": bool(url)},
            whisper_models=len(speech_models(ctx.service.models.all())),
            mic=can_record(),
        )

    return collect


class RuntimeBox(QGroupBox):
    """llama.cpp's build and backends, GPUs, MLX, the AMX probe, budget, paths and warnings."""

    def __init__(
        self, bridge: Bridge, source: Callable[[], dict[str, Any]], parent: QWidget | None = None
    ) -> None:
        super().__init__("Runtime", parent)
        self._bridge = bridge
        self._source = source
        self.report: dict[str, Any] | None = None
        # the report runs nvidia-smi and imports mlx (seconds): only once the section is seen
        self.checking = False
        self._checked = False
        self.details_label = QLabel("Checking…")
        self.details_label.setWordWrap(True)
        self.details_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.warnings_label = QLabel("")
        self.warnings_label.setWordWrap(True)
        self.warnings_label.setStyleSheet("color:#b35900; font-weight:bold")
        self.warnings_label.hide()
        self.refresh_button = QPushButton("Check again")
        self.copy_button = QPushButton("Copy report")
        self.copy_button.setEnabled(False)
        buttons = QHBoxLayout()
        buttons.addWidget(self.refresh_button)
        buttons.addWidget(self.copy_button)
        buttons.addStretch(1)
        layout = QVBoxLayout(self)
        layout.addWidget(self.warnings_label)
        layout.addWidget(self.details_label)
        layout.addLayout(buttons)
        self.refresh_button.clicked.connect(self.refresh)
        self.copy_button.clicked.connect(self._on_copy_button_clicked)

    def showEvent(self, event: QShowEvent) -> None:  # noqa: N802 - Qt's name
        super().showEvent(event)
        if not self._checked:
            self.refresh()

    def refresh(self) -> None:
        self._checked = self.checking = True
        self.refresh_button.setEnabled(False)

        async def run() -> dict[str, Any]:
            return await asyncio.to_thread(self._source)

        self._bridge.run(run(), on_done=self._on_report, on_error=self._on_failed)

    def _on_report(self, report: dict[str, Any]) -> None:
        self.checking = False
        self.report = report
        self.refresh_button.setEnabled(True)
        self.copy_button.setEnabled(True)
        lines = [ln for ln in doctor.text(report) if not ln.startswith("Warning: ")]
        self.details_label.setText("\n".join(lines))
        warnings = report["warnings"]
        self.warnings_label.setVisible(bool(warnings))
        self.warnings_label.setText("\n\n".join(f"⚠ {w}" for w in warnings))

    def _on_failed(self, exc: BaseException) -> None:
        self.checking = False
        self.refresh_button.setEnabled(True)
        self.details_label.setText("Could not check: " + log_failure(log, "doctor failed", exc))

    def _on_copy_button_clicked(self) -> None:
        if self.report is not None:
            QGuiApplication.clipboard().setText("\n".join(doctor.text(self.report)))
