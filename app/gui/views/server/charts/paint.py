"""Painting shared by the Server page's small charts: the frame, the empty state and one series
(a line over the last generations with its name, latest and median, and a y axis).
Tested by tests/gui/views/server/charts/test_speed.py and
tests/gui/views/server/charts/test_prompt_cache.py."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

from PySide6.QtCore import QEvent, QPointF, QRectF, QSize, Qt
from PySide6.QtGui import (
    QColor,
    QFont,
    QFontMetrics,
    QPainter,
    QPaintEvent,
    QPalette,
    QPen,
    QPixmap,
    QPolygonF,
    QResizeEvent,
)
from PySide6.QtWidgets import QSizePolicy, QWidget

from app.core.events import RequestFinished

P = TypeVar("P")


class PixmapChart(QWidget, Generic[P]):
    """The last ``cap`` points made from ``RequestFinished`` events (``_point_of``), summarized
    once per point (``_summarize``) and painted once into a pixmap (``_render``): again only
    after a new point, a resize, or a palette or font change."""

    def __init__(self, cap: int, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.cap = cap
        self._points: deque[P] = deque(maxlen=cap)
        self._picture: QPixmap | None = None
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.setMinimumHeight(130)

    # what each chart defines: the point an event makes (None: not one of its points), the
    # summaries of its points, and its picture
    _point_of: Callable[[RequestFinished], P | None]
    _summarize: Callable[[], None]
    _render: Callable[[], QPixmap]

    # -- data -----------------------------------------------------------------------------------
    def add(self, event: RequestFinished) -> bool:
        """Add a point for ``event`` if it was a completed generation; True when added."""
        point = self._point_of(event)
        if point is None:
            return False
        self._points.append(point)
        self._summarize()
        self._invalidate()
        return True

    def clear(self) -> None:
        self._points.clear()
        self._summarize()
        self._invalidate()

    @property
    def points(self) -> tuple[P, ...]:
        """Oldest first."""
        return tuple(self._points)

    @property
    def is_empty(self) -> bool:
        return not self._points

    # -- Qt -------------------------------------------------------------------------------------

    def sizeHint(self) -> QSize:
        return QSize(520, 140)

    def changeEvent(self, event: QEvent) -> None:
        if event.type() in (QEvent.Type.PaletteChange, QEvent.Type.FontChange):
            self._invalidate()
        super().changeEvent(event)

    def resizeEvent(self, event: QResizeEvent) -> None:
        self._picture = None
        super().resizeEvent(event)

    def paintEvent(self, event: QPaintEvent) -> None:
        if self._picture is None:
            self._picture = self._render()
        p = QPainter(self)
        p.drawPixmap(0, 0, self._picture)
        p.end()

    def _invalidate(self) -> None:
        self._picture = None
        self.update()


def nice_ceiling(value: float) -> float:
    """The axis top: ``value`` rounded up to 1, 2, 2.5 or 5 times a power of ten."""
    if value <= 0:
        return 1.0
    base = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 2.5, 5, 10):
        if value <= step * base:
            return step * base
    return 10 * base  # unreachable


def fmt_axis(v: float) -> str:
    return f"{v / 1000:g}k" if v >= 10_000 else f"{v:g}"


def begin_picture(widget: QWidget) -> tuple[QPixmap, QPainter, QRectF]:
    """A pixmap the widget's size with the framed, palette-coloured background painted."""
    dpr = widget.devicePixelRatioF()
    picture = QPixmap(widget.size() * dpr)
    picture.setDevicePixelRatio(dpr)
    picture.fill(Qt.GlobalColor.transparent)
    pal = widget.palette()
    p = QPainter(picture)
    p.setRenderHint(QPainter.RenderHint.Antialiasing)
    frame = QRectF(widget.rect()).adjusted(0.5, 0.5, -0.5, -0.5)
    p.setPen(QPen(pal.color(QPalette.ColorRole.Mid), 1))
    p.setBrush(pal.color(QPalette.ColorRole.Base))
    p.drawRoundedRect(frame, 4, 4)
    return picture, p, frame


def two_areas(frame: QRectF) -> tuple[QRectF, QRectF]:
    """The left and right plot areas inside the frame."""
    inner = frame.adjusted(10, 8, -12, -6)
    gap = 24.0
    w = (inner.width() - gap) / 2
    left = QRectF(inner.left(), inner.top(), w, inner.height())
    right = QRectF(inner.left() + w + gap, inner.top(), w, inner.height())
    return left, right


def is_dark(widget: QWidget) -> bool:
    return widget.palette().color(QPalette.ColorRole.Base).lightness() < 128


def paint_empty(widget: QWidget, p: QPainter, frame: QRectF, text: str, hint: str) -> None:
    pal = widget.palette()
    font = QFont(widget.font())
    font.setBold(True)
    p.setFont(font)
    p.setPen(pal.color(QPalette.ColorRole.PlaceholderText))
    h = p.fontMetrics().height()
    mid = frame.center().y()
    p.drawText(
        QRectF(frame.left(), mid - h, frame.width(), h),
        Qt.AlignmentFlag.AlignHCenter | Qt.AlignmentFlag.AlignBottom,
        text,
    )
    p.setFont(widget.font())
    # wrapped onto a second line where the chart is narrow (two charts side by side)
    p.drawText(
        QRectF(frame.left() + 8, mid + 2, frame.width() - 16, 2 * h),
        Qt.AlignmentFlag.AlignHCenter | Qt.AlignmentFlag.AlignTop | Qt.TextFlag.TextWordWrap,
        hint,
    )


HEADER_GAP = 10  # px between a series' name and its summary


def header_summary(
    fm: QFontMetrics, line: QRectF, title_w: float, summary: str
) -> tuple[QRectF, str]:
    """Where a series' "latest · median" goes on its header ``line`` after a title
    ``title_w`` wide, and the summary shortened to fit it: right-aligned text wider than its
    box would lose its start ("atest 11.7…")."""
    room = max(0.0, line.width() - title_w - HEADER_GAP)
    where = QRectF(line.left() + title_w + HEADER_GAP, line.top(), room, line.height())
    return where, fm.elidedText(summary, Qt.TextElideMode.ElideRight, int(room))


def paint_series(
    widget: QWidget,
    p: QPainter,
    area: QRectF,
    *,
    title: str,
    values: Sequence[float | None],
    summary: str,
    median: float | None,
    color: QColor,
    unit: str,
    top: float | None = None,
    axis_text: Callable[[float], str] = fmt_axis,
) -> None:
    """One series; ``None`` values are generations it has no value for (left out of the line).
    ``top`` fixes the y axis (a percentage's 100); by default it fits the largest value."""
    pal = widget.palette()
    text = pal.color(QPalette.ColorRole.Text)
    muted = pal.color(QPalette.ColorRole.PlaceholderText)
    fm = p.fontMetrics()
    line_h = fm.height()

    # header: the series' name in its colour, then latest and median
    bold = QFont(widget.font())
    bold.setBold(True)
    p.setFont(bold)
    p.setPen(color)
    p.drawText(QRectF(area.left(), area.top(), area.width(), line_h), title)
    title_w = p.fontMetrics().horizontalAdvance(title)
    p.setFont(widget.font())
    p.setPen(text)
    where, shown = header_summary(
        fm, QRectF(area.left(), area.top(), area.width(), line_h), title_w, summary
    )
    p.drawText(where, Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter, shown)

    # plot: y axis on the left, x axis is the generations, oldest to latest
    measured = [v for v in values if v is not None]
    if top is None:
        top = nice_ceiling(max(measured) * 1.1) if measured and max(measured) > 0 else 1.0
    axis_w = max(fm.horizontalAdvance(axis_text(top)), fm.horizontalAdvance(unit)) + 6
    plot = QRectF(
        area.left() + axis_w,
        area.top() + line_h + 6,
        area.width() - axis_w,
        area.height() - 2 * line_h - 10,
    )
    grid = QColor(pal.color(QPalette.ColorRole.Mid))
    grid.setAlpha(110)
    for frac in (0.0, 0.5, 1.0):
        y = plot.bottom() - frac * plot.height()
        p.setPen(QPen(grid, 1))
        p.drawLine(QPointF(plot.left(), y), QPointF(plot.right(), y))
        p.setPen(muted)
        p.drawText(
            QRectF(area.left(), y - line_h / 2, axis_w - 6, line_h),
            Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter,
            axis_text(top * frac),
        )
    below = QRectF(area.left(), plot.bottom() + 3, area.width(), line_h)
    p.drawText(below, Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignTop, unit)
    n = len(values)
    p.drawText(
        below.adjusted(axis_w, 0, 0, 0),
        Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignTop,
        f"last {n} generation{'s' if n != 1 else ''}",
    )
    p.drawText(below, Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignTop, "latest")
    if not measured:
        p.drawText(plot, Qt.AlignmentFlag.AlignCenter, "not measured")
        return

    def at(i: int, v: float) -> QPointF:
        x = plot.right() if n == 1 else plot.left() + i * plot.width() / (n - 1)
        return QPointF(x, plot.bottom() - min(v / top, 1.0) * plot.height())

    if median is not None:
        faint = QColor(color)
        faint.setAlpha(120)
        p.setPen(QPen(faint, 1, Qt.PenStyle.DashLine))
        y = at(0, median).y()
        p.drawLine(QPointF(plot.left(), y), QPointF(plot.right(), y))
    pts = [at(i, v) for i, v in enumerate(values) if v is not None]
    p.setPen(QPen(color, 1.6))
    if len(pts) > 1:
        p.drawPolyline(QPolygonF(pts))
    # dots are round-capped points: one call for all of them
    dot = QPen(color, 4.0 if len(pts) > 20 else 5.2)
    dot.setCapStyle(Qt.PenCapStyle.RoundCap)
    p.setPen(dot)
    p.drawPoints(QPolygonF(pts))
    dot.setWidthF(7.2)  # the latest stands out
    p.setPen(dot)
    p.drawPoint(pts[-1])
