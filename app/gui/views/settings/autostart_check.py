"""The "Start at login" switch the welcome and the Settings page share.
Tested by tests/gui/views/settings/test_hf_token.py and tests/gui/views/library/test_welcome.py."""

from __future__ import annotations

import logging

from PySide6.QtCore import Signal
from PySide6.QtGui import QShowEvent
from PySide6.QtWidgets import QCheckBox, QWidget

from app.core.desktop.autostart import Autostart
from app.gui.bridge import Bridge, log_failure
from app.settings import SettingsStore

log = logging.getLogger(__name__)


class StartAtLoginCheck(QCheckBox):
    """The "Start at login" switch: writes or removes the OS autostart entry and records the
    choice in the settings (on the loop thread); shows the entry's real state when shown."""

    changed = Signal(bool)  # the entry was written (True) or removed (False)
    failed = Signal(str)

    def __init__(
        self,
        autostart: Autostart,
        store: SettingsStore,
        bridge: Bridge,
        parent: QWidget | None = None,
    ) -> None:
        super().__init__("Start Hearth when I log in", parent)
        self._autostart = autostart
        self._store = store
        self._bridge = bridge
        self.setToolTip(
            f"Starts Hearth in the background at login ({autostart.location}); the server "
            "starts too if “Start the server when Hearth starts” is on"
        )
        self.sync()
        self.toggled.connect(self._on_toggled)

    def sync(self) -> None:
        """Show whether the entry exists now (another page or the user may have changed it)."""
        self.blockSignals(True)
        try:
            self.setChecked(self._autostart.enabled())
        finally:
            self.blockSignals(False)

    def showEvent(self, e: QShowEvent) -> None:  # noqa: N802 - Qt override
        self.sync()
        super().showEvent(e)

    def _on_toggled(self, on: bool) -> None:
        autostart, store = self._autostart, self._store

        def write() -> bool:
            autostart.set_enabled(on)
            store.update(start_at_login=on)
            return on

        def failed(exc: BaseException) -> None:
            self.sync()
            self.failed.emit(log_failure(log, "start at login", exc))

        self._bridge.call(write, on_done=self.changed.emit, on_error=failed)
