"""CacheChart: the prompt-cache hit rate and batch size of the server's last generations."""

from __future__ import annotations

from dataclasses import dataclass

from PySide6.QtGui import QColor, QPixmap
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
from app.gui.views.server.charts.speed import DEFAULT_CAP, SeriesSummary, summarize

EMPTY_TEXT = "No generations yet"
EMPTY_HINT = (
    "The prompt-cache hit rate and batch size of each completed generation will appear here."
)
_HITS_LIGHT, _HITS_DARK = QColor("#1a7f37"), QColor("#4cc38a")
_BATCH_LIGHT, _BATCH_DARK = QColor("#7a3fb0"), QColor("#b98ae6")


@dataclass(frozen=True, slots=True)
class CachePoint:
    """One completed generation: what share of its prompt the cache held, and how many
    sequences were decoded together with it (None: not known)."""

    at: float
    hit_rate: float | None  # percent of the prompt's tokens reused; None: no prompt tokens
    batch_size: float | None  # mean sequences per decode step; None: the runtime did not say


def format_percent(v: float) -> str:
    return f"{v:.0f}%"


def format_batch(v: float) -> str:
    return f"{v:.1f}"


def cache_point(event: RequestFinished) -> CachePoint | None:
    """The point for a completed generation with a hit rate or a batch size; else None."""
    if event.status >= 400 or event.completion_tokens <= 0:
        return None
    hits = (
        100.0 * min(event.cached_tokens, event.prompt_tokens) / event.prompt_tokens
        if event.prompt_tokens > 0
        else None
    )
    batch = event.batch_size if event.batch_size > 0 else None  # 0: a remote engine, unknown
    if hits is None and batch is None:
        return None
    return CachePoint(event.at, hits, batch)


class CacheChart(PixmapChart[CachePoint]):
    """Two small line charts over the last ``cap`` generations: the prompt-cache hit rate (%)
    and the batch size, painted like the SpeedChart (cached pixmap, palette-aware)."""

    def __init__(self, cap: int = DEFAULT_CAP, parent: QWidget | None = None) -> None:
        super().__init__(cap, parent)
        self._hits = SeriesSummary(None, None)
        self._batch = SeriesSummary(None, None)
        self._update_text()

    def _point_of(self, event: RequestFinished) -> CachePoint | None:
        return cache_point(event)

    @property
    def hits_summary(self) -> SeriesSummary:
        return self._hits

    @property
    def batch_summary(self) -> SeriesSummary:
        return self._batch

    def hits_text(self) -> str:
        """``"latest 93% · median 88%"``."""
        return self._hits.text(format_percent, "")

    def batch_text(self) -> str:
        """``"latest 3.9 · median 2.0"``."""
        return self._batch.text(format_batch, "")

    def _summarize(self) -> None:
        self._hits = summarize([p.hit_rate for p in self._points if p.hit_rate is not None])
        self._batch = summarize([p.batch_size for p in self._points if p.batch_size is not None])
        self._update_text()

    def _update_text(self) -> None:
        if self.is_empty:
            text = EMPTY_TEXT
        else:
            text = (
                f"Prompt cache hits: {self.hits_text()}. "
                f"Batch size: {self.batch_text()}. "
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
            dark = is_dark(self)
            paint_series(
                self,
                p,
                left,
                title="Prompt cache hits",
                values=[pt.hit_rate for pt in self._points],
                summary=self.hits_text(),
                median=self._hits.median,
                color=_HITS_DARK if dark else _HITS_LIGHT,
                unit="%",
                top=100.0,
                axis_text=lambda v: f"{v:g}",
            )
            paint_series(
                self,
                p,
                right,
                title="Batch size",
                values=[pt.batch_size for pt in self._points],
                summary=self.batch_text(),
                median=self._batch.median,
                color=_BATCH_DARK if dark else _BATCH_LIGHT,
                unit="seqs",
            )
        p.end()
        return picture
