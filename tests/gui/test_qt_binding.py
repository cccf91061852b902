"""The Qt binding itself: PySide6 6.12.0 dropped a reference to None on every call of a method
that returns nothing (Python < 3.12, where None is not immortal); a real session then aborts with
"Fatal Python error: none_dealloc" after a few thousand calls. pyproject.toml excludes it; this
test catches any other release that does the same."""

from __future__ import annotations

import sys

from PySide6.QtWidgets import QLabel
from pytestqt.qtbot import QtBot


def test_void_calls_keep_none_alive(qtbot: QtBot) -> None:
    label = QLabel()
    qtbot.addWidget(label)
    before = sys.getrefcount(None)
    for _ in range(500):
        label.setText("x")
        label.setEnabled(True)
        label.update()
    after = sys.getrefcount(None)
    assert abs(after - before) < 100, f"None lost {before - after} references in 1,500 calls"
