"""Settings › Logs: whether request and answer text is recorded (``records.log_content``,
applied with the rest of the page), what that means for privacy, and the logs folder.
Tested by tests/gui/views/settings/test_logs.py."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QUrl, Signal
from PySide6.QtGui import QDesktopServices
from PySide6.QtWidgets import QCheckBox, QGroupBox, QHBoxLayout, QLabel, QPushButton, QVBoxLayout

from app.paths import AppPaths

LOG_FILE_NAME = "hearth.log"  # written by app.cli.common.setup_logging
PRIVACY_TEXT = (
    "When on, Hearth keeps the text of each request (the prompt, with its system prompt and "
    "files) and of each answer, up to {chars:,} characters each, beside the request log in "
    "{db}. Anyone who can read your files (your user account, its backups, an administrator) "
    "can read them. Off keeps only model, timings and token counts."
)


class LogsBox(QGroupBox):
    """The body-recording switch with its warning, the log file's path and "Open logs folder"."""

    open_failed = Signal(str)  # the folder could not be opened: a message for the banner

    def __init__(self, paths: AppPaths | None = None, *, chars: int = 4096) -> None:
        super().__init__("Logs")
        # the folders setup_logging writes to: HEARTH_HOME, else the platform's
        paths = paths or AppPaths.default()
        self._folder = paths.logs
        self.record_check = QCheckBox("Record the text of requests and answers")
        self.privacy_label = QLabel(PRIVACY_TEXT.format(chars=chars, db=paths.requests_db))
        self.privacy_label.setWordWrap(True)
        self.privacy_label.setStyleSheet("color:#7a4b00")
        self.file_label = QLabel(
            f"Hearth's own log: {self._folder / LOG_FILE_NAME} (a few MB, older parts "
            "kept as .1 to .3; no request text)."
        )
        self.file_label.setWordWrap(True)
        self.open_button = QPushButton("Open logs folder")
        col = QVBoxLayout(self)
        col.addWidget(self.record_check)
        col.addWidget(self.privacy_label)
        row = QHBoxLayout()
        row.addWidget(self.file_label, 1)
        row.addWidget(self.open_button)
        col.addLayout(row)
        self.open_button.clicked.connect(self._on_open_button_clicked)

    def logs_folder(self) -> Path:
        return self._folder

    def _on_open_button_clicked(self) -> None:
        folder = self._folder
        folder.mkdir(parents=True, exist_ok=True)  # small and local: no need for the loop
        if not QDesktopServices.openUrl(QUrl.fromLocalFile(str(folder))):
            self.open_failed.emit(f"Could not open {folder}.")
