"""SpeedChart on its own: which requests make a point, the summaries, the empty state, painting."""

from __future__ import annotations

from PySide6.QtGui import QColor, QImage, QPalette
from pytestqt.qtbot import QtBot

from app.core.events import RequestFinished
from app.gui.views.server.charts.speed import EMPTY_TEXT, SpeedChart, nice_ceiling


def gen(decode: float, prompt: float = 0.0, *, status: int = 200, out: int = 8) -> RequestFinished:
    return RequestFinished(
        "POST", "/v1/chat/completions", status, "m", 100, out, 0.5, decode,
        prompt_tokens_per_second=prompt,
    )  # fmt: skip


def dark_pixels(widget: SpeedChart) -> int:
    img = widget.grab().toImage().convertToFormat(QImage.Format.Format_RGB32)
    return sum(
        1
        for y in range(0, img.height(), 2)
        for x in range(0, img.width(), 2)
        if QColor(img.pixel(x, y)).lightness() < 128
    )


def test_empty_state(qtbot: QtBot) -> None:
    chart = SpeedChart()
    qtbot.addWidget(chart)
    assert chart.is_empty and chart.points == ()
    assert chart.toolTip() == EMPTY_TEXT
    assert chart.decode_summary.text() == "not measured"


def test_only_completed_generations_make_points(qtbot: QtBot) -> None:
    chart = SpeedChart()
    qtbot.addWidget(chart)
    assert not chart.add(RequestFinished("GET", "/v1/models", 200, None, 0, 0, 0.01, 0.0))
    assert not chart.add(RequestFinished("POST", "/v1/embeddings", 200, "m", 12, 0, 0.1, 0.0))
    assert not chart.add(gen(50.0, status=500))
    assert not chart.add(gen(0.0, 900.0))  # a runtime that measured nothing
    assert chart.is_empty
    assert chart.add(gen(40.0, 1000.0))
    assert chart.add(gen(60.0))  # decode measured, prompt not
    assert chart.add(gen(45.0, 1200.0))
    assert [(p.decode_tps, p.prompt_tps) for p in chart.points] == [
        (40.0, 1000.0),
        (60.0, 0.0),
        (45.0, 1200.0),
    ]
    assert (chart.decode_summary.latest, chart.decode_summary.median) == (45.0, 45.0)
    assert (chart.prompt_summary.latest, chart.prompt_summary.median) == (1200.0, 1100.0)
    assert chart.decode_summary.text() == "latest 45.0 · median 45.0 tok/s"
    assert chart.prompt_summary.text() == "latest 1,200 · median 1,100 tok/s"
    assert "Last 3 generations" in chart.toolTip()


def test_keeps_the_last_cap_points(qtbot: QtBot) -> None:
    chart = SpeedChart(cap=5)
    qtbot.addWidget(chart)
    for i in range(1, 9):
        chart.add(gen(float(i), 10.0 * i))
    assert [p.decode_tps for p in chart.points] == [4.0, 5.0, 6.0, 7.0, 8.0]
    assert chart.decode_summary.median == 6.0
    chart.clear()
    assert chart.is_empty and chart.toolTip() == EMPTY_TEXT


def test_paints_with_the_palette(qtbot: QtBot) -> None:
    chart = SpeedChart()
    qtbot.addWidget(chart)
    chart.resize(700, 140)
    light = QPalette(chart.palette())
    light.setColor(QPalette.ColorRole.Base, QColor("#ffffff"))
    light.setColor(QPalette.ColorRole.Text, QColor("#101010"))
    chart.setPalette(light)
    empty_light = dark_pixels(chart)
    for i in range(30):
        chart.add(gen(30.0 + i % 7, 800.0 + 13 * i))
    assert dark_pixels(chart) > empty_light  # lines, dots and labels were drawn
    dark = QPalette(light)
    dark.setColor(QPalette.ColorRole.Base, QColor("#1e1e1e"))
    dark.setColor(QPalette.ColorRole.Window, QColor("#2b2b2b"))
    dark.setColor(QPalette.ColorRole.Text, QColor("#eeeeee"))
    chart.setPalette(dark)
    img = chart.grab().toImage()
    # the background follows the palette's Base (sampled inside the frame, off the plots)
    assert QColor(img.pixel(img.width() // 2, img.height() // 2)).lightness() < 80


def test_nice_ceiling() -> None:
    assert [nice_ceiling(v) for v in (0, 0.7, 1, 3, 42, 180, 2600)] == [
        1.0,
        1.0,
        1.0,
        5.0,
        50.0,
        200.0,
        5000.0,
    ]


def test_speeds_read_whole_from_100_tok_s_and_to_a_tenth_below() -> None:
    from app.gui.views.server.charts.speed import format_speed

    assert format_speed(141.84) == "142"
    assert format_speed(1234.5) == "1,234"
    assert format_speed(99.94) == "99.9"
    assert format_speed(7.24) == "7.2"


def test_a_header_summary_too_long_for_its_line_is_cut_at_its_end_not_its_start(
    qtbot: QtBot,
) -> None:
    from PySide6.QtCore import QRectF
    from PySide6.QtGui import QFontMetrics

    from app.gui.views.server.charts.paint import header_summary

    chart = SpeedChart()
    qtbot.addWidget(chart)
    fm = QFontMetrics(chart.font())
    summary = "latest 11.7 · median 11.4 tok/s"
    title_w = fm.horizontalAdvance("Generation (decode)")
    for width in range(int(title_w) + 20, int(title_w) + 20 + fm.horizontalAdvance(summary) + 40):
        where, shown = header_summary(fm, QRectF(0, 0, width, fm.height()), title_w, summary)
        assert where.left() > title_w  # after the title
        assert where.right() <= width
        # the text fits its box, so right-aligned it keeps its start ("latest", not "atest")
        assert fm.horizontalAdvance(shown) <= where.width()
        assert shown == summary or shown.endswith("…") or not shown
