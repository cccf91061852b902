"""Links stay readable in both themes: the status bar's link meets WCAG AA contrast (4.5:1)
against the window background after switching light -> dark and dark -> light."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import pytest
from PySide6.QtGui import QColor, QPalette
from PySide6.QtWidgets import QApplication, QLabel
from pytestqt.qtbot import QtBot

from app.gui.main_window import MainWindow
from app.gui.theme import apply_theme
from tests.gui.helpers import contrast


def drawn_link_colour(label: QLabel) -> QColor:
    """The colour the label's link is painted in: its most common bluish pixel."""
    img = label.grab().toImage()
    counts: Counter[str] = Counter()
    for x in range(img.width()):
        for y in range(img.height()):
            c = img.pixelColor(x, y)
            if 190 <= c.hsvHue() <= 260 and c.hsvSaturation() > 60:
                counts[c.name()] += 1
    assert counts, "no link drawn"
    return QColor(counts.most_common(1)[0][0])


@pytest.fixture
def restore_theme() -> Iterator[None]:
    yield
    apply_theme("system")


@pytest.mark.parametrize(("first", "then"), [("light", "dark"), ("dark", "light")])
def test_status_bar_links_are_readable_after_a_theme_change(
    window: MainWindow, qtbot: QtBot, restore_theme: None, first: str, then: str
) -> None:
    qtbot.waitUntil(lambda: "<a " in window.memory_status.text(), timeout=10_000)
    apply_theme(first)
    # a status-bar link set under the first theme and not re-set since (as the Discover page's
    # Hub links are)
    label = QLabel("<a href='x'>Open the folder</a>")
    window.statusBar().addWidget(label)
    apply_theme(then)
    palette = QApplication.palette()  # the label gets it on a later event: read it here
    for shown in (label, window.memory_status):
        link = drawn_link_colour(shown)
        background = palette.color(QPalette.ColorRole.Window)
        assert contrast(link, background) >= 4.5, (then, link.name(), background.name())
    palette_link = palette.color(QPalette.ColorRole.Link)
    assert contrast(palette_link, background) >= 4.5
