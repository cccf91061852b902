"""Settings › Window: the theme and what closing the window does (``ui`` in settings.json).
Both wait for Apply like the rest of the page. "Keep serving in the background" cannot be
chosen here where the desktop has no tray: closing would leave no icon to reopen Hearth from.
Tested by tests/gui/views/settings/test_apply.py."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import Qt
from PySide6.QtGui import QStandardItemModel
from PySide6.QtWidgets import QComboBox, QFormLayout, QGroupBox, QLabel, QWidget

from app.gui.tray import Tray

THEME_CHOICES = (("system", "Follow the system"), ("light", "Light"), ("dark", "Dark"))
CLOSE_CHOICES = (
    ("ask", "Ask"),
    ("background", "Keep serving in the background"),
    ("quit", "Quit"),
)
NO_TRAY_TEXT = (
    "This desktop has no tray, so “Keep serving in the background” is not offered here: a "
    "hidden window could only be reopened by running hearth again. Closing asks instead."
)


class WindowBox(QGroupBox):
    """The two combos; the page reads and writes their values (``SettingsForm``)."""

    def __init__(
        self, tray_available: Callable[[], bool] | None = None, parent: QWidget | None = None
    ) -> None:
        super().__init__("Window", parent)
        self.tray = (tray_available or Tray.available)()
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
        self.no_tray_label = QLabel(NO_TRAY_TEXT)
        self.no_tray_label.setWordWrap(True)
        self.no_tray_label.setStyleSheet("color:#6b6b6b")
        if not self.tray:
            model = self.close_combo.model()
            if isinstance(model, QStandardItemModel):
                item = model.item(self.close_combo.findData("background"))
                item.setEnabled(False)  # a saved "background" is still shown, not offered
                item.setToolTip(NO_TRAY_TEXT)
        wf = QFormLayout(self)
        wf.setRowWrapPolicy(QFormLayout.RowWrapPolicy.WrapLongRows)
        wf.addRow("Theme", self.theme_combo)
        wf.addRow("Closing the window while serving", self.close_combo)
        wf.addRow("", self.no_tray_label)
        self.no_tray_label.setVisible(not self.tray)
        self.no_tray_label.setTextFormat(Qt.TextFormat.PlainText)

    def background_offered(self) -> bool:
        """Whether "Keep serving in the background" can be chosen (the desktop has a tray)."""
        return self.tray
