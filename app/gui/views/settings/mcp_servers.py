"""Settings › MCP servers: mcp.json edited as text, validated on Save (bad JSON: the
error, and the file stays as it was), a status list (server: running N tools / its error) and
Restart. Files are read and written on the loop thread, through the bridge; servers restart
there too, so the GUI never waits on one."""

from __future__ import annotations

import logging
from typing import Any

from PySide6.QtGui import QFontDatabase, QShowEvent
from PySide6.QtWidgets import (
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QPlainTextEdit,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app.core.util.fsutil import atomic_write_bytes
from app.core.workspace.mcp import McpManager, ServerStatus, parse_config
from app.errors import HearthError
from app.gui.bridge import Bridge, error_text
from app.gui.views.common import MessageBanner

log = logging.getLogger(__name__)

EXAMPLE = """{
  "mcpServers": {
    "files": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem", "~"]},
    "web": {"url": "https://example.com/mcp", "headers": {"Authorization": "Bearer ${TOKEN}"}}
  }
}
"""


class McpServersBox(QGroupBox):
    def __init__(
        self, bridge: Bridge, manager: McpManager | None, parent: QWidget | None = None
    ) -> None:
        super().__init__("MCP servers (tools for the chat)", parent)
        self._bridge = bridge
        self.manager = manager
        self.loaded = False
        self.path_label = QLabel(str(manager.config_path) if manager else "")
        self.path_label.setWordWrap(True)
        self.editor = QPlainTextEdit()
        self.editor.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        self.editor.setPlaceholderText(EXAMPLE)
        self.editor.setMinimumHeight(140)
        self.banner = MessageBanner()
        self.status_list = QListWidget()
        self.status_list.setMaximumHeight(110)
        self.save_button = QPushButton("Save and restart servers")
        self.restart_button = QPushButton("Restart")
        self.restart_button.setToolTip("Restart the selected server (none selected: all of them)")
        self.revert_button = QPushButton("Revert")
        self.revert_button.setToolTip("Show mcp.json as it is on disk")
        buttons = QHBoxLayout()
        buttons.addWidget(self.revert_button)
        buttons.addStretch(1)
        buttons.addWidget(self.restart_button)
        buttons.addWidget(self.save_button)
        note = QLabel(
            "The common notation: stdio servers take command, args, env, cwd; Streamable HTTP "
            'servers take url and headers; "disabled": true keeps one off. ${VAR} in env, '
            "args and headers is read from Hearth's environment. A server's stderr goes to "
            "logs/mcp-NAME.log."
        )
        note.setWordWrap(True)
        note.setStyleSheet("color:#6b6b6b")
        layout = QVBoxLayout(self)
        layout.addWidget(self.path_label)
        layout.addWidget(self.banner)
        layout.addWidget(self.editor)
        layout.addWidget(note)
        layout.addWidget(QLabel("Status"))
        layout.addWidget(self.status_list)
        layout.addLayout(buttons)
        self.save_button.clicked.connect(self._on_save_button_clicked)
        self.restart_button.clicked.connect(self._on_restart_button_clicked)
        self.revert_button.clicked.connect(self.load)
        self.setVisible(manager is not None)
        if manager is not None:
            self.load()

    # -- actions ------------------------------------------------------------------------------
    def load(self) -> None:
        """Read mcp.json (loop thread) into the editor, and the servers' states."""
        m = self.manager
        if m is None:
            return

        def read() -> tuple[str, list[ServerStatus]]:
            try:
                text = m.config_path.read_text(encoding="utf-8")
            except FileNotFoundError:
                text = ""
            return text, m.statuses()

        self._bridge.call(read, on_done=self._on_read, on_error=self._on_failed)

    def refresh_statuses(self) -> None:
        """The servers' states now (each time the page is shown; edits are kept)."""
        if self.manager is not None:
            self._bridge.call(self.manager.statuses, on_done=self._show_statuses)

    def showEvent(self, e: QShowEvent) -> None:  # noqa: N802 - Qt override
        super().showEvent(e)
        if self.loaded:
            self.refresh_statuses()

    def save(self) -> bool:
        """Validate, write, restart. False (and the error shown) when the text is unusable."""
        m = self.manager
        if m is None:
            return False
        text = self.editor.toPlainText()
        try:
            cfg = parse_config(text)  # pure: no file, no process
        except HearthError as e:
            self.banner.show_message(e.message, "error")
            return False
        data = (text.rstrip() + "\n").encode("utf-8") if text.strip() else b""

        async def write_and_restart() -> list[ServerStatus]:
            m.config_path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(m.config_path, data, mode=0o600)  # headers may carry tokens
            return await m.start(cfg)

        self.banner.show_message("Saved; starting the servers…", "notice")
        self.save_button.setEnabled(False)
        self._bridge.run(write_and_restart(), on_done=self._on_started, on_error=self._on_failed)
        return True

    def restart(self) -> None:
        m = self.manager
        if m is None:
            return
        item = self.status_list.currentItem()
        name = item.data(256) if item is not None and item.isSelected() else None
        self.restart_button.setEnabled(False)
        self._bridge.run(m.restart(name), on_done=self._on_started, on_error=self._on_failed)

    # -- slots -------------------------------------------------------------------------------
    def _on_save_button_clicked(self) -> None:
        self.save()

    def _on_restart_button_clicked(self) -> None:
        self.restart()

    def _on_read(self, result: tuple[str, list[ServerStatus]]) -> None:
        text, statuses = result
        self.editor.setPlainText(text)
        self.loaded = True
        self._show_statuses(statuses)

    def _on_started(self, statuses: list[ServerStatus]) -> None:
        self.save_button.setEnabled(True)
        self.restart_button.setEnabled(True)
        self._show_statuses(statuses)
        bad = [s for s in statuses if s.state == "error"]
        if bad:
            self.banner.show_message(
                "Some servers did not start: " + "; ".join(f"{s.name}: {s.error}" for s in bad),
                "error",
            )
        else:
            self.banner.show_message("MCP servers restarted.", "info")

    def _on_failed(self, exc: BaseException) -> None:
        self.save_button.setEnabled(True)
        self.restart_button.setEnabled(True)
        self.banner.show_message(error_text(exc), "error")

    def _show_statuses(self, statuses: list[Any]) -> None:
        self.status_list.clear()
        if not statuses:
            self.status_list.addItem("No servers in mcp.json.")
        for s in statuses:
            item = QListWidgetItem(f"{s.name}: {s.summary}")
            item.setData(256, s.name)  # Qt.UserRole
            self.status_list.addItem(item)
