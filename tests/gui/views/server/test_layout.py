"""The Server page gives its height to what users watch (the charts and the logs) at the default
and the minimum window size; API keys and the response cache sit on their own tab."""

from __future__ import annotations

from PySide6.QtCore import QPoint
from PySide6.QtWidgets import QWidget
from pytestqt.qtbot import QtBot

from app.gui.main_window import MainWindow
from app.gui.views.server.page import CHART_MIN_WIDTH, ServerPage
from app.gui.window_state import DEFAULT_SIZE, MINIMUM_SIZE


def visible_rows(page: ServerPage) -> int:
    table = page.request_table
    return table.viewport().height() // table.verticalHeader().defaultSectionSize()


def shown_whole(widget: QWidget, viewport: QWidget) -> bool:
    """Whether all of ``widget`` lies inside ``viewport`` (not scrolled or cut off)."""
    top = widget.mapTo(viewport, QPoint(0, 0))
    return top.y() >= 0 and top.y() + widget.height() <= viewport.height()


def test_at_the_default_size_the_charts_and_the_request_log_have_room(
    window: MainWindow, qtbot: QtBot
) -> None:
    window.resize(DEFAULT_SIZE)
    window.show_page("Server")
    page = window.server_page
    qtbot.waitUntil(lambda: page.charts_area.height() >= 160, timeout=10_000)
    viewport = page.charts_area.viewport()
    assert shown_whole(page.speed_chart, viewport)
    assert shown_whole(page.cache_chart, viewport)
    assert page.speed_chart.height() >= page.speed_chart.minimumHeight()
    assert visible_rows(page) >= 8
    # keys and the cache are one click away, not in the watched area
    assert not page.keys_section.isVisible()
    assert not page.cache_section.isVisible()
    page.tabs.setCurrentWidget(page.access_tab)
    qtbot.waitUntil(lambda: page.keys_section.isVisible() and page.cache_section.isVisible())


def test_at_the_minimum_size_chart_headers_are_whole_and_the_log_shows_rows(
    window: MainWindow, qtbot: QtBot
) -> None:
    window.resize(MINIMUM_SIZE)
    window.show_page("Server")
    page = window.server_page
    qtbot.waitUntil(lambda: window.size() == MINIMUM_SIZE, timeout=10_000)
    qtbot.waitUntil(lambda: page.charts_area.height() >= 160, timeout=10_000)
    for title in page.chart_titles:
        assert title.width() >= title.sizeHint().width()
    # each chart is wide enough to draw its two series' headers unclipped
    for chart in (page.speed_chart, page.cache_chart):
        assert chart.width() >= CHART_MIN_WIDTH
    assert shown_whole(page.speed_chart, page.charts_area.viewport())
    assert visible_rows(page) >= 3
