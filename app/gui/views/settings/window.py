"""Settings › Window: the theme and what closing the window does, each written to
settings.json (``ui``) at once, without Save.
Tested by tests/gui/views/settings/test_hf_token.py."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QComboBox, QFormLayout, QGroupBox, QWidget

from app.gui.bridge import Bridge
from app.settings import Settings, SettingsStore

THEME_CHOICES = (("system", "Follow the system"), ("light", "Light"), ("dark", "Dark"))
CLOSE_CHOICES = (
    ("ask", "Ask"),
    ("background", "Keep serving in the background"),
    ("quit", "Quit"),
)


class WindowBox(QGroupBox):
    theme_chosen = Signal(str)  # ui.theme picked in the combo: apply it at once
    saved = Signal(object)  # Settings, as written

    def __init__(
        self,
        store: SettingsStore,
        bridge: Bridge,
        on_error: Callable[[BaseException], None],
        parent: QWidget | None = None,
    ) -> None:
        super().__init__("Window", parent)
        self._store = store
        self._bridge = bridge
        self._on_error = on_error
        self.theme_combo = QComboBox()
        for value, label in THEME_CHOICES:
            self.theme_combo.addItem(label, value)
        self.close_combo = QComboBox()
        for value, label in CLOSE_CHOICES:
            self.close_combo.addItem(label, value)
        self.close_combo.setToolTip(
            "While the server runs. Keeping it serving hides Hearth in the tray where there is "
            "one; Ask asks only on desktops without a tray."
        )
        wf = QFormLayout(self)
        wf.addRow("Theme", self.theme_combo)
        wf.addRow("Closing the window while serving", self.close_combo)
        self.theme_combo.activated.connect(self._on_theme_combo_activated)
        self.close_combo.activated.connect(self._on_close_combo_activated)

    def show_settings(self, s: Settings) -> None:
        self.theme_combo.setCurrentIndex(max(0, self.theme_combo.findData(s.ui.theme)))
        self.close_combo.setCurrentIndex(max(0, self.close_combo.findData(s.ui.close_action)))

    def set_ui(self, **changes: str) -> None:
        """Write ``ui`` fields (theme, close_action) now, keeping the rest as on disk."""

        def write() -> Settings:
            return self._store.update_ui(**changes)

        self._bridge.call(write, on_done=self.saved.emit, on_error=self._on_error)

    def _on_theme_combo_activated(self, _index: int) -> None:
        theme = str(self.theme_combo.currentData())
        self.theme_chosen.emit(theme)
        self.set_ui(theme=theme)

    def _on_close_combo_activated(self, _index: int) -> None:
        self.set_ui(close_action=str(self.close_combo.currentData()))
