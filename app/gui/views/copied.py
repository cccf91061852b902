"""Copy to the clipboard with feedback where the user looks: the button that copied reads
"Copied" for a moment, then its own text again.
Tested by tests/gui/views/test_connect.py, tests/gui/views/library/test_search_and_menu.py and
tests/gui/views/chat/test_transcript.py."""

from __future__ import annotations

from PySide6.QtCore import QTimer
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QAbstractButton

COPIED_TEXT = "Copied"
COPIED_MS = 1500
_ORIGINAL = "hearthOriginalText"  # the button's own text, kept while it says "Copied"


def copy_text(text: str, button: QAbstractButton | None = None) -> None:
    """Put ``text`` on the clipboard; ``button`` (the one clicked) says so briefly."""
    QGuiApplication.clipboard().setText(text)
    if button is not None:
        flash_copied(button)


def flash_copied(button: QAbstractButton, said: str = COPIED_TEXT) -> None:
    """``button`` reads ``said`` for a moment, then its own text again."""
    original = button.property(_ORIGINAL)
    if original is None:  # a second click while it shows "Copied" keeps the first text
        original = button.text()
        button.setProperty(_ORIGINAL, original)
        # the width of the longer text, so the row does not jump
        button.setMinimumWidth(max(button.minimumWidth(), button.sizeHint().width()))
    button.setText(said)
    QTimer.singleShot(COPIED_MS, button, lambda: _restore(button, said))


def _restore(button: QAbstractButton, said: str) -> None:
    original = button.property(_ORIGINAL)
    if original is not None and button.text() == said:
        button.setText(original)
        button.setProperty(_ORIGINAL, None)
