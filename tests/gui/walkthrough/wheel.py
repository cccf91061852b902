"""The mouse wheel over a widget: a real X wheel click (``xdotool click 4/5``, through the X
server and Qt's xcb input) under a real X server, else QWheelEvents sent through QApplication
(offscreen, where there is no pointer)."""

from __future__ import annotations

import logging
import shutil
import subprocess
from collections.abc import Sequence

from PySide6.QtCore import QPoint, QPointF, Qt
from PySide6.QtGui import QGuiApplication, QWheelEvent
from PySide6.QtWidgets import QAbstractScrollArea, QApplication, QScrollArea, QWidget

from tests.gui.walkthrough.harness import wait_until

log = logging.getLogger("walkthrough")


def x_wheel() -> bool:
    """Whether wheel clicks go through the X server (xcb platform and xdotool present)."""
    return QGuiApplication.platformName() == "xcb" and shutil.which("xdotool") is not None


def wheel_over(widget: QWidget, *, down: bool = True) -> None:
    """One wheel notch with the pointer over the middle of ``widget``."""
    centre = widget.rect().center()
    if x_wheel():
        p = widget.mapToGlobal(centre)
        button = "5" if down else "4"  # X's wheel buttons: 4 up, 5 down
        cmd = ["xdotool", "mousemove", "--sync", str(p.x()), str(p.y()), "click", button]
        subprocess.run(cmd, check=True, timeout=30)
        return
    # offscreen: no pointer, and Qt hands a sent (not spontaneous) wheel event to no parent, so
    # pass it up the parent chain until a widget takes it, as Qt does with a real one
    target: QWidget | None = widget
    pos = QPointF(centre)
    while target is not None:
        event = QWheelEvent(
            pos,
            QPointF(target.mapToGlobal(pos)),
            QPoint(0, 0),
            QPoint(0, -120 if down else 120),
            Qt.MouseButton.NoButton,
            Qt.KeyboardModifier.NoModifier,
            Qt.ScrollPhase.NoScrollPhase,
            False,
        )
        QApplication.sendEvent(target, event)
        if event.isAccepted() or target.isWindow():
            return
        pos = QPointF(target.mapToParent(pos))
        target = target.parentWidget()


def scroll_with_wheel(area: QAbstractScrollArea, widgets: Sequence[QWidget]) -> bool:
    """Bring each of ``widgets`` into view and turn the wheel over it (down, or up at the
    bottom); each notch must scroll ``area`` (StepFailed otherwise). Returns False when the
    page fits and there is nothing to scroll."""
    bar = area.verticalScrollBar()
    if bar.maximum() <= 0:
        return False  # everything fits: there is nothing to scroll
    for widget in widgets:
        if isinstance(area, QScrollArea):
            area.ensureWidgetVisible(widget, 0, 80)
        QApplication.processEvents()
        before = bar.value()
        wheel_over(widget, down=before < bar.maximum())
        wait_until(
            lambda before=before: bar.value() != before,  # type: ignore[misc]
            f"the page to scroll under the wheel over {type(widget).__name__}",
            15,
        )
        log.info("wheel over %s scrolled %d -> %d", type(widget).__name__, before, bar.value())
    return True
