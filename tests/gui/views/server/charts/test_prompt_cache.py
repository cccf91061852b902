"""CacheChart on its own and on the Server page: which requests make a point, the hit rate and
batch size summaries, the empty state, painting; and the request log's CPU-busy note."""

from __future__ import annotations

from dataclasses import replace

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QImage, QPalette
from pytestqt.qtbot import QtBot

from app.core.events import RequestFinished
from app.gui.context import GuiContext
from app.gui.main_window import MainWindow
from app.gui.models.request_log import COLUMNS, RequestLogModel
from app.gui.views.server.charts.prompt_cache import EMPTY_TEXT, CacheChart
from tests.gui.helpers import a_record, write_records


def gen(
    prompt: int,
    cached: int = 0,
    batch: float = 0.0,
    *,
    status: int = 200,
    out: int = 8,
    cpu_busy: bool = False,
) -> RequestFinished:
    return RequestFinished(
        "POST", "/v1/chat/completions", status, "m", prompt, out, 0.5, 40.0 if out else 0.0,
        prompt_tokens_per_second=900.0, cached_tokens=cached, batch_size=batch, cpu_busy=cpu_busy,
    )  # fmt: skip


def dark_pixels(widget: CacheChart) -> int:
    img = widget.grab().toImage().convertToFormat(QImage.Format.Format_RGB32)
    return sum(
        1
        for y in range(0, img.height(), 2)
        for x in range(0, img.width(), 2)
        if QColor(img.pixel(x, y)).lightness() < 128
    )


def test_empty_state(qtbot: QtBot) -> None:
    chart = CacheChart()
    qtbot.addWidget(chart)
    assert chart.is_empty and chart.points == ()
    assert chart.toolTip() == EMPTY_TEXT
    assert chart.hits_text() == "not measured" and chart.batch_text() == "not measured"
    assert not chart.grab().isNull()


def test_hit_rate_and_batch_size_per_generation(qtbot: QtBot) -> None:
    chart = CacheChart()
    qtbot.addWidget(chart)
    assert not chart.add(RequestFinished("GET", "/v1/models", 200, None, 0, 0, 0.01, 0.0))
    assert not chart.add(RequestFinished("POST", "/v1/embeddings", 200, "m", 12, 0, 0.1, 0.0))
    assert not chart.add(gen(100, 90, 2.0, status=500))
    assert not chart.add(gen(0, 0, 0.0))  # neither a prompt nor a batch size: nothing to plot
    assert chart.is_empty
    assert chart.add(gen(1000, 0, 1.0))  # a cold prompt, decoded alone
    assert chart.add(gen(1000, 880, 2.0))
    assert chart.add(gen(200, 0, 0.0))  # a remote engine: no batch size
    assert chart.add(gen(0, 0, 3.0))  # no prompt tokens: no hit rate
    assert chart.add(gen(1000, 930, 3.9))
    assert [(p.hit_rate, p.batch_size) for p in chart.points] == [
        (0.0, 1.0),
        (88.0, 2.0),
        (0.0, None),
        (None, 3.0),
        (93.0, 3.9),
    ]
    assert (chart.hits_summary.latest, chart.hits_summary.median) == (93.0, 44.0)
    assert (chart.batch_summary.latest, chart.batch_summary.median) == (3.9, 2.5)
    assert chart.hits_text() == "latest 93% · median 44%"
    assert chart.batch_text() == "latest 3.9 · median 2.5"
    tip = chart.toolTip()
    assert "Prompt cache hits: latest 93% · median 44%" in tip
    assert "Batch size: latest 3.9 · median 2.5" in tip
    assert "Last 5 generations" in tip


def test_keeps_the_last_cap_points(qtbot: QtBot) -> None:
    chart = CacheChart(cap=3)
    qtbot.addWidget(chart)
    for i in range(1, 6):
        chart.add(gen(100, 10 * i, float(i)))
    assert [p.batch_size for p in chart.points] == [3.0, 4.0, 5.0]
    assert chart.hits_summary.median == 40.0
    chart.clear()
    assert chart.is_empty and chart.toolTip() == EMPTY_TEXT


def test_paints_with_the_palette(qtbot: QtBot) -> None:
    chart = CacheChart()
    qtbot.addWidget(chart)
    chart.resize(700, 140)
    light = QPalette(chart.palette())
    light.setColor(QPalette.ColorRole.Base, QColor("#ffffff"))
    light.setColor(QPalette.ColorRole.Text, QColor("#101010"))
    chart.setPalette(light)
    empty_light = dark_pixels(chart)
    for i in range(30):
        chart.add(gen(1000, 100 * (i % 10), 1.0 + i % 4))
    assert dark_pixels(chart) > empty_light  # lines, dots and labels were drawn
    dark = QPalette(light)
    dark.setColor(QPalette.ColorRole.Base, QColor("#1e1e1e"))
    dark.setColor(QPalette.ColorRole.Window, QColor("#2b2b2b"))
    dark.setColor(QPalette.ColorRole.Text, QColor("#eeeeee"))
    chart.setPalette(dark)
    img = chart.grab().toImage()
    assert QColor(img.pixel(img.width() // 2, img.height() // 2)).lightness() < 80


def test_the_server_page_charts_and_logs_each_finished_request(
    window: MainWindow, qtbot: QtBot, gui_ctx: GuiContext
) -> None:
    """The page's charts are fed from the service's events, through the bridge; its log shows
    the request's record, with the event's CPU-busy note and batch size."""
    window.show_page("Server")
    page = window.server_page
    assert page.cache_chart.isVisible() and page.cache_chart.is_empty
    finished = replace(gen(1200, 1024, 2.0, cpu_busy=True), arrived_at=1_700_000_000.0)

    async def publish() -> None:
        gui_ctx.service.events.publish(finished)

    gui_ctx.loop.call(publish(), timeout=10)
    qtbot.waitUntil(lambda: len(page.cache_chart.points) == 1, timeout=10_000)
    point = page.cache_chart.points[0]
    assert round(point.hit_rate or 0) == 85 and point.batch_size == 2.0
    assert len(page.speed_chart.points) == 1
    # the event's record is committed a moment later (as the server's records are)
    write_records(
        gui_ctx.paths.requests_db,
        [a_record(0, route="/v1/chat/completions", prompt_tokens=1200, cached_tokens=1024)],
    )
    qtbot.waitUntil(lambda: page.request_model.rowCount() == 1, timeout=10_000)
    model = page.request_model
    note = model.index(0, COLUMNS.index("Note"))
    assert note.data() == "CPU busy"
    tip = model.index(0, 0).data(Qt.ItemDataRole.ToolTipRole)
    assert "slower: the CPU is busy with other programs" in tip
    assert "batch 2.0" in tip


def test_the_request_log_notes_a_busy_cpu_only_when_it_was() -> None:
    model = RequestLogModel()
    model.reset([(1, a_record(1)), (0, a_record(0))])
    note = COLUMNS.index("Note")
    model.note_live(replace(gen(100, 0, 1.0), arrived_at=a_record(0).time))
    assert model.index(1, note).data() == ""
    assert "CPU" not in model.index(1, 0).data(Qt.ItemDataRole.ToolTipRole)
    model.note_live(replace(gen(100, 0, 1.0, cpu_busy=True), arrived_at=a_record(1).time))
    assert model.index(0, note).data() == "CPU busy"
    assert model.index(1, note).data() == ""
    assert "slower: the CPU is busy with other programs" in model.index(0, 3).data(
        Qt.ItemDataRole.ToolTipRole
    )
