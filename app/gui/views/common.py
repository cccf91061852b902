"""Small widgets the pages share."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel, QWidget

PAGE_MARGINS = (20, 14, 20, 12)
_STYLES = {
    "info": "background:#e7f1fb; color:#0b3d6b; border:1px solid #b6d4f0;",
    "error": "background:#fdecea; color:#7a1212; border:1px solid #f3b9b3;",
}


class MessageBanner(QLabel):
    """An inline notice at the top of a page: errors are shown here, never as a crash."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWordWrap(True)
        self.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.kind = ""
        self.hide()

    def show_message(self, text: str, kind: str = "info") -> None:
        self.kind = kind
        self.setText(text)
        self.setStyleSheet(
            f"QLabel {{ {_STYLES.get(kind, _STYLES['info'])} border-radius:4px; padding:6px 10px; }}"
        )
        self.show()

    def clear_message(self) -> None:
        self.kind = ""
        self.clear()
        self.hide()


def page_title(text: str) -> QLabel:
    label = QLabel(text)
    font = label.font()
    font.setPointSizeF(font.pointSizeF() * 1.5)
    font.setBold(True)
    label.setFont(font)
    return label
