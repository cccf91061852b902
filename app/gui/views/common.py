"""Small widgets the pages share.
Tested by tests/gui/views/test_connect.py, tests/gui/views/test_discover.py and
tests/gui/views/test_common.py."""

from __future__ import annotations

from PySide6.QtCore import QEvent, QObject, Qt, QTimer
from PySide6.QtWidgets import (
    QAbstractSlider,
    QAbstractSpinBox,
    QComboBox,
    QLabel,
    QStyle,
    QToolButton,
    QWidget,
)

from app.gui.theme import is_dark, theme_signals

PAGE_MARGINS = (20, 14, 20, 12)
# (light palette, dark palette) per kind: tinted like the message, readable on either
_STYLES = {
    "info": (
        "background:#e7f1fb; color:#0b3d6b; border:1px solid #b6d4f0;",
        "background:#1c3349; color:#d3e6fa; border:1px solid #35597d;",
    ),
    "error": (
        "background:#fdecea; color:#7a1212; border:1px solid #f3b9b3;",
        "background:#4a1f1c; color:#ffd9d4; border:1px solid #86403a;",
    ),
}
AUTO_HIDE_MS = 6000  # an info message goes away on its own after this long
_CLOSE_SPACE = 28  # right padding that keeps the text clear of the close button


class MessageBanner(QLabel):
    """An inline notice at the top of a page: errors are shown here, never as a crash.

    Kinds: "info" (a confirmation such as "Copied": hides itself after ``auto_hide_ms``),
    "notice" (a state, such as "the Hub is unavailable": looks like info, stays) and "error"
    (stays until closed with its × button or replaced)."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWordWrap(True)
        self.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.kind = ""
        self.auto_hide_ms = AUTO_HIDE_MS
        self.hide_timer = QTimer(self)
        self.hide_timer.setSingleShot(True)
        self.hide_timer.timeout.connect(self._on_hide_timer_timeout)
        self.close_button = QToolButton(self)
        self.close_button.setAutoRaise(True)
        self.close_button.setIcon(
            self.style().standardIcon(QStyle.StandardPixmap.SP_TitleBarCloseButton)
        )
        self.close_button.setToolTip("Dismiss")
        self.close_button.clicked.connect(self._on_close_button_clicked)
        self._styled_dark: bool | None = None
        theme_signals().changed.connect(self._on_theme_changed)
        self.hide()

    def show_message(self, text: str, kind: str = "info") -> None:
        self.kind = kind
        self.setText(text)
        self._restyle()
        self.show()
        if kind == "info":
            self.hide_timer.start(self.auto_hide_ms)
        else:
            self.hide_timer.stop()

    def clear_message(self) -> None:
        self.hide_timer.stop()
        self.kind = ""
        self.clear()
        self.hide()

    def changeEvent(self, e: QEvent) -> None:  # noqa: N802 - Qt override
        super().changeEvent(e)
        if e.type() in (QEvent.Type.PaletteChange, QEvent.Type.ApplicationPaletteChange):
            self._on_theme_changed()  # the desktop switched light/dark ("system" theme)

    def _on_theme_changed(self) -> None:
        # only when light/dark flipped, so restyling (itself a palette change) cannot loop
        if self.kind and self._styled_dark is not None and self._styled_dark != is_dark():
            self._restyle()

    def resizeEvent(self, e: object) -> None:  # noqa: N802 - Qt override
        super().resizeEvent(e)  # type: ignore[arg-type]
        size = self.close_button.sizeHint()
        self.close_button.move(
            self.width() - size.width() - 4, (self.height() - size.height()) // 2
        )

    def _restyle(self) -> None:
        dark = is_dark()
        self._styled_dark = dark
        light_css, dark_css = _STYLES["error" if self.kind == "error" else "info"]
        self.setStyleSheet(
            f"QLabel {{ {dark_css if dark else light_css} border-radius:4px;"
            f" padding:6px {_CLOSE_SPACE}px 6px 10px; }}"
            " QToolButton { border:none; background:transparent; padding:0; }"
        )

    def _on_hide_timer_timeout(self) -> None:
        if self.kind == "info":
            self.clear_message()

    def _on_close_button_clicked(self) -> None:
        self.clear_message()


def page_title(text: str) -> QLabel:
    label = QLabel(text)
    font = label.font()
    font.setPointSizeF(font.pointSizeF() * 1.5)
    font.setBold(True)
    label.setFont(font)
    return label


VALUE_WIDGETS = (QAbstractSpinBox, QComboBox, QAbstractSlider)


class WheelGuard(QObject):
    """Lets the mouse wheel change a value widget only while it has the keyboard focus: over an
    unfocused one the wheel is left to the page (it scrolls), so scrolling never edits a value."""

    def eventFilter(self, watched: QObject, e: QEvent) -> bool:  # noqa: N802 - Qt override
        if e.type() == QEvent.Type.Wheel and isinstance(watched, QWidget):
            if not watched.hasFocus():
                e.ignore()  # unaccepted: Qt hands a real wheel event on to the scroll area
                return True
        return False


def guard_wheel(root: QWidget) -> None:
    """Make every spin box, combo box and slider under ``root`` (and ``root`` itself) take the
    wheel only when focused (by click or Tab: ``Qt.StrongFocus``, never by the wheel itself).
    Call it once the widgets exist; calling it again skips widgets already guarded."""
    found = [root] if isinstance(root, VALUE_WIDGETS) else []
    found += [w for w in root.findChildren(QWidget) if isinstance(w, VALUE_WIDGETS)]
    for w in found:
        if w.property("wheel_guarded"):
            continue
        w.setProperty("wheel_guarded", True)
        w.setFocusPolicy(Qt.FocusPolicy.StrongFocus)
        w.installEventFilter(WheelGuard(w))
