"""SpeedChart: decode and prompt tok/s of the server's last generations, painted with QPainter."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass

from PySide6.QtGui import QColor, QPalette, QPixmap
from PySide6.QtWidgets import QWidget

from app.core.events import RequestFinished
from app.gui.views.server.charts.paint import (
    PixmapChart,
    begin_picture,
    is_dark,
    paint_empty,
    paint_series,
    two_areas,
)
from app.gui.views.server.charts.paint import nice_ceiling as nice_ceiling  # where callers look

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

    def text(self, fmt: Callable[[float], str] | None = None, unit: str = " tok/s") -> str:
        """``"latest 45.0 · median 42.1 tok/s"``; ``fmt`` formats a value (tok/s by default)."""
        if self.latest is None or self.median is None:
            return "not measured"
        f = fmt or format_speed
        return f"latest {f(self.latest)} · median {f(self.median)}{unit}"


def format_speed(v: float) -> str:
    return f"{v:,.0f}" if v >= 100 else f"{v:.1f}"


def is_generation(event: RequestFinished) -> bool:
    """A request that generated tokens and whose decode speed the runtime measured."""
    return event.status < 400 and event.completion_tokens > 0 and event.tokens_per_second > 0


class SpeedChart(PixmapChart[SpeedPoint]):
    """Two small line charts over the last ``cap`` generations: decode and prompt tok/s.

    Points come from ``RequestFinished`` events (``add``); the summaries are computed once per
    point and the picture is drawn into a cached pixmap, so a repaint (expose, scroll, tooltip)
    only copies the pixmap until a point is added or the size, palette or font changes.
    """

    def __init__(self, cap: int = DEFAULT_CAP, parent: QWidget | None = None) -> None:
        super().__init__(cap, parent)
        self._decode = SeriesSummary(None, None)
        self._prompt = SeriesSummary(None, None)
        self._update_text()

    def _point_of(self, event: RequestFinished) -> SpeedPoint | None:
        if not is_generation(event):
            return None
        return SpeedPoint(
            event.at, event.tokens_per_second, max(event.prompt_tokens_per_second, 0.0)
        )

    @property
    def decode_summary(self) -> SeriesSummary:
        return self._decode

    @property
    def prompt_summary(self) -> SeriesSummary:
        return self._prompt

    def _summarize(self) -> None:
        self._decode = summarize([p.decode_tps for p in self._points])
        self._prompt = summarize([p.prompt_tps for p in self._points if p.prompt_tps > 0])
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
    def _render(self) -> QPixmap:
        picture, p, frame = begin_picture(self)
        if self.is_empty:
            paint_empty(self, p, frame, EMPTY_TEXT, EMPTY_HINT)
        else:
            left, right = two_areas(frame)
            for area, title, values, summary, color in (
                (
                    left,
                    "Generation (decode)",
                    [pt.decode_tps for pt in self._points],
                    self._decode,
                    self.palette().color(QPalette.ColorRole.Highlight),
                ),
                (
                    right,
                    "Prompt processing",
                    [pt.prompt_tps for pt in self._points],
                    self._prompt,
                    _PROMPT_DARK if is_dark(self) else _PROMPT_LIGHT,
                ),
            ):
                paint_series(
                    self,
                    p,
                    area,
                    title=title,
                    values=[v if v > 0 else None for v in values],  # 0: not measured
                    summary=summary.text(),
                    median=summary.median,
                    color=color,
                    unit="tok/s",
                )
        p.end()
        return picture


def summarize(values: list[float]) -> SeriesSummary:
    """The latest and median of ``values`` (oldest first)."""
    if not values:
        return SeriesSummary(None, None)
    return SeriesSummary(values[-1], statistics.median(values))
