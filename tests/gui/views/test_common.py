"""The wheel guard: over an unfocused spin box, combo box or slider the wheel changes nothing
(the page scrolls instead); a focused one still takes it."""

from __future__ import annotations

from PySide6.QtCore import QPoint, QPointF, Qt
from PySide6.QtGui import QWheelEvent
from PySide6.QtWidgets import (
    QApplication,
    QComboBox,
    QDoubleSpinBox,
    QLineEdit,
    QSlider,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)
from pytestqt.qtbot import QtBot

from app.gui.views.common import guard_wheel


def wheel(widget: QWidget, steps: int = -1) -> None:
    """A real wheel event over the middle of ``widget`` (a notch down for ``steps`` -1)."""
    centre = QPointF(widget.rect().center())
    event = QWheelEvent(
        centre,
        QPointF(widget.mapToGlobal(centre.toPoint())),
        QPoint(0, 0),
        QPoint(0, 120 * steps),
        Qt.MouseButton.NoButton,
        Qt.KeyboardModifier.NoModifier,
        Qt.ScrollPhase.NoScrollPhase,
        False,
    )
    QApplication.sendEvent(widget, event)


def values(combo: QComboBox, spin: QSpinBox, dspin: QDoubleSpinBox, slider: QSlider) -> tuple:
    return combo.currentIndex(), spin.value(), dspin.value(), slider.value()


def test_the_wheel_changes_a_value_only_when_its_widget_has_the_focus(qtbot: QtBot) -> None:
    page = QWidget()
    qtbot.addWidget(page)
    combo = QComboBox()
    combo.addItems(["one", "two", "three"])
    spin, dspin, slider = QSpinBox(), QDoubleSpinBox(), QSlider(Qt.Orientation.Horizontal)
    spin.setValue(50)
    dspin.setValue(50.0)
    slider.setValue(50)
    other = QLineEdit()
    col = QVBoxLayout(page)
    for w in (combo, spin, dspin, slider, other):
        col.addWidget(w)
    guard_wheel(page)
    page.show()
    qtbot.waitExposed(page)
    page.activateWindow()
    other.setFocus()
    qtbot.waitUntil(other.hasFocus, timeout=5_000)

    before = values(combo, spin, dspin, slider)
    for w in (combo, spin, dspin, slider):
        wheel(w)
        wheel(w.lineEdit() if isinstance(w, QSpinBox) else w)  # over the spin's text too
    assert values(combo, spin, dspin, slider) == before
    for w in (combo, spin, dspin, slider):
        assert w.focusPolicy() == Qt.FocusPolicy.StrongFocus  # the wheel never gives it focus

    combo.setFocus()  # clicked or tabbed into: now the wheel is the user's intent
    qtbot.waitUntil(combo.hasFocus, timeout=5_000)
    wheel(combo)
    assert combo.currentIndex() == before[0] + 1
    spin.setFocus()
    qtbot.waitUntil(spin.hasFocus, timeout=5_000)
    wheel(spin, steps=1)
    assert spin.value() == before[1] + 1
