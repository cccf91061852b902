"""SpeedChart: decode and prompt tok/s of the server's last generations, painted with QPainter."""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass

from PySide6.QtCore import QEvent, QPointF, QRectF, QSize, Qt
from PySide6.QtGui import (
    QColor,
    QFont,
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

EMPTY_TEXT = "No generations yet"
EMPTY_HINT = "The decode and prompt speed of each completed generation will appear here."
DEFAULT_CAP = 60
# the prompt series' colour; the decode series uses the palette's highlight
_PROMPT_LIGHT = QColor("#c0611a")
_PROMPT_DARK = QColor("#f0a04b")


@dataclass(frozen=True, slots=True)
class SpeedPoint:
    """One completed generation as the server measured it."""

    at: float
    decode_tps: float
    prompt_tps: float  # 0.0: not measured (e.g. a remote runtime sent no timings)


@dataclass(frozen=True, slots=True)
class SeriesSummary:
    latest: float | None
    median: float | None

    def text(self) -> str:
        if self.latest is None or self.median is None:
            return "not measured"
        return f"latest {format_speed(self.latest)} · median {format_speed(self.median)} tok/s"


def format_speed(v: float) -> str:
    return f"{v:,.0f}" if v >= 100 else f"{v:.1f}"


def is_generation(event: RequestFinished) -> bool:
    """A request that generated tokens and whose decode speed the runtime measured."""
    return event.status < 400 and event.completion_tokens > 0 and event.tokens_per_second > 0


def nice_ceiling(value: float) -> float:
    """The axis top: ``value`` rounded up to 1, 2, 2.5 or 5 times a power of ten."""
    if value <= 0:
        return 1.0
    base = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 2.5, 5, 10):
        if value <= step * base:
            return step * base
    return 10 * base  # unreachable


def _fmt_axis(v: float) -> str:
    return f"{v / 1000:g}k" if v >= 10_000 else f"{v:g}"


class SpeedChart(QWidget):
    """Two small line charts over the last ``cap`` generations: decode and prompt tok/s.

    Points come from ``RequestFinished`` events (``add``); the summaries are computed once per
    point and the picture is drawn into a cached pixmap, so a repaint (expose, scroll, tooltip)
    only copies the pixmap until a point is added or the size, palette or font changes.
    """

    def __init__(self, cap: int = DEFAULT_CAP, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.cap = cap
        self._points: deque[SpeedPoint] = deque(maxlen=cap)
        self._decode = SeriesSummary(None, None)
        self._prompt = SeriesSummary(None, None)
        self._picture: QPixmap | None = None
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.setMinimumHeight(130)
        self._update_text()

    # -- data -------------------------------------------------------------------------------------
    def add(self, event: RequestFinished) -> bool:
        """Add a point for ``event`` if it was a completed generation; True when added."""
        if not is_generation(event):
            return False
        self._points.append(
            SpeedPoint(event.at, event.tokens_per_second, max(event.prompt_tokens_per_second, 0.0))
        )
        self._summarize()
        self._invalidate()
        return True

    def clear(self) -> None:
        self._points.clear()
        self._summarize()
        self._invalidate()

    @property
    def points(self) -> tuple[SpeedPoint, ...]:
        """Oldest first."""
        return tuple(self._points)

    @property
    def is_empty(self) -> bool:
        return not self._points

    @property
    def decode_summary(self) -> SeriesSummary:
        return self._decode

    @property
    def prompt_summary(self) -> SeriesSummary:
        return self._prompt

    def _summarize(self) -> None:
        self._decode = _summary([p.decode_tps for p in self._points])
        self._prompt = _summary([p.prompt_tps for p in self._points if p.prompt_tps > 0])
        self._update_text()

    def _update_text(self) -> None:
        if self.is_empty:
            text = EMPTY_TEXT
        else:
            text = (
                f"Generation: {self._decode.text()}. "
                f"Prompt processing: {self._prompt.text()}. "
                f"Last {len(self._points)} generations."
            )
        self.setToolTip(text)
        self.setAccessibleDescription(text)

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

    def _render(self) -> QPixmap:
        dpr = self.devicePixelRatioF()
        picture = QPixmap(self.size() * dpr)
        picture.setDevicePixelRatio(dpr)
        picture.fill(Qt.GlobalColor.transparent)
        pal = self.palette()
        p = QPainter(picture)
        p.setRenderHint(QPainter.RenderHint.Antialiasing)
        frame = QRectF(self.rect()).adjusted(0.5, 0.5, -0.5, -0.5)
        p.setPen(QPen(pal.color(QPalette.ColorRole.Mid), 1))
        p.setBrush(pal.color(QPalette.ColorRole.Base))
        p.drawRoundedRect(frame, 4, 4)
        if self.is_empty:
            self._paint_empty(p, frame)
        else:
            inner = frame.adjusted(10, 8, -12, -6)
            gap = 24.0
            w = (inner.width() - gap) / 2
            left = QRectF(inner.left(), inner.top(), w, inner.height())
            right = QRectF(inner.left() + w + gap, inner.top(), w, inner.height())
            dark = pal.color(QPalette.ColorRole.Base).lightness() < 128
            self._paint_series(
                p,
                left,
                "Generation (decode)",
                [pt.decode_tps for pt in self._points],
                self._decode,
                pal.color(QPalette.ColorRole.Highlight),
            )
            self._paint_series(
                p,
                right,
                "Prompt processing",
                [pt.prompt_tps for pt in self._points],
                self._prompt,
                _PROMPT_DARK if dark else _PROMPT_LIGHT,
            )
        p.end()
        return picture

    def _paint_empty(self, p: QPainter, frame: QRectF) -> None:
        pal = self.palette()
        font = QFont(self.font())
        font.setBold(True)
        p.setFont(font)
        p.setPen(pal.color(QPalette.ColorRole.PlaceholderText))
        h = p.fontMetrics().height()
        mid = frame.center().y()
        p.drawText(
            QRectF(frame.left(), mid - h, frame.width(), h),
            Qt.AlignmentFlag.AlignHCenter | Qt.AlignmentFlag.AlignBottom,
            EMPTY_TEXT,
        )
        p.setFont(self.font())
        p.drawText(
            QRectF(frame.left(), mid + 2, frame.width(), h),
            Qt.AlignmentFlag.AlignHCenter | Qt.AlignmentFlag.AlignTop,
            EMPTY_HINT,
        )

    def _paint_series(
        self,
        p: QPainter,
        area: QRectF,
        title: str,
        values: list[float],
        summary: SeriesSummary,
        color: QColor,
    ) -> None:
        pal = self.palette()
        text = pal.color(QPalette.ColorRole.Text)
        muted = pal.color(QPalette.ColorRole.PlaceholderText)
        fm = p.fontMetrics()
        line_h = fm.height()

        # header: the series' name in its colour, then latest and median
        bold = QFont(self.font())
        bold.setBold(True)
        p.setFont(bold)
        p.setPen(color)
        p.drawText(QRectF(area.left(), area.top(), area.width(), line_h), title)
        title_w = p.fontMetrics().horizontalAdvance(title)
        p.setFont(self.font())
        p.setPen(text)
        p.drawText(
            QRectF(area.left() + title_w + 10, area.top(), area.width() - title_w - 10, line_h),
            Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter,
            fm.elidedText(summary.text(), Qt.TextElideMode.ElideRight, int(area.width() - title_w)),
        )

        # plot: y axis in tok/s on the left, x axis is the generations, oldest to latest
        measured = [v for v in values if v > 0]
        top = nice_ceiling(max(measured) * 1.1) if measured else 1.0
        axis_w = max(fm.horizontalAdvance(_fmt_axis(top)), fm.horizontalAdvance("tok/s")) + 6
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
                _fmt_axis(top * frac),
            )
        below = QRectF(area.left(), plot.bottom() + 3, area.width(), line_h)
        p.drawText(below, Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignTop, "tok/s")
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
            return QPointF(x, plot.bottom() - v / top * plot.height())

        if summary.median is not None:
            faint = QColor(color)
            faint.setAlpha(120)
            pen = QPen(faint, 1, Qt.PenStyle.DashLine)
            p.setPen(pen)
            y = at(0, summary.median).y()
            p.drawLine(QPointF(plot.left(), y), QPointF(plot.right(), y))
        pts = [at(i, v) for i, v in enumerate(values) if v > 0]
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


def _summary(values: list[float]) -> SeriesSummary:
    if not values:
        return SeriesSummary(None, None)
    return SeriesSummary(values[-1], statistics.median(values))
