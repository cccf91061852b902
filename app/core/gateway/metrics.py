"""Server metrics from RequestFinished events: what ``GET /api/v1/metrics`` answers.

Bounded by construction: per-model entries exist only for names the caller says are known (the
library's and the providers' models; everything else is counted under ``other``), and the
time-to-first-token percentiles are over the last ``TTFT_WINDOW`` generations of each.
"""

from __future__ import annotations

import collections
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from app.core.events import RequestFinished

OTHER_MODEL = "other"  # requests naming a model that is neither in the library nor a provider's
TTFT_WINDOW = 1024
# polling these must not count as traffic (a probe every second would swamp the numbers)
MONITORING_ROUTES = frozenset({"/health", "/metrics", "/api/v1/metrics"})


def percentile(values: Sequence[float], q: float) -> float | None:
    """The nearest-rank ``q`` percentile (0 < q <= 100) of ``values``; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[rank - 1]


@dataclass
class Tally:
    """Requests, tokens, decode speeds and TTFTs of one model (or of all of them)."""

    total: int = 0
    ok: int = 0
    failed: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    tps_sum: float = 0.0
    tps_n: int = 0
    ttft_ms: collections.deque[float] = field(
        default_factory=lambda: collections.deque(maxlen=TTFT_WINDOW)
    )

    def add(self, ev: RequestFinished) -> None:
        self.total += 1
        if ev.status < 400:
            self.ok += 1
        else:
            self.failed += 1
        self.tokens_in += ev.prompt_tokens
        self.tokens_out += ev.completion_tokens
        if ev.tokens_per_second > 0:
            self.tps_sum += ev.tokens_per_second
            self.tps_n += 1
        if ev.ttft_ms is not None:
            self.ttft_ms.append(ev.ttft_ms)

    def as_dict(self) -> dict[str, Any]:
        def ms(v: float | None) -> float | None:
            return None if v is None else round(v, 3)

        samples = list(self.ttft_ms)
        return {
            "requests": {"total": self.total, "ok": self.ok, "failed": self.failed},
            "tokens": {"in": self.tokens_in, "out": self.tokens_out},
            "tokens_per_second": round(self.tps_sum / self.tps_n, 3) if self.tps_n else None,
            "ttft_ms": {"p50": ms(percentile(samples, 50)), "p95": ms(percentile(samples, 95))},
        }


class RequestMetrics:
    """Tallies of finished requests, overall and per model. Feed it with :meth:`observe`
    (an EventHub listener); ``known(model_id)`` says which names get their own entry."""

    def __init__(
        self, known: Callable[[str], bool], *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._known = known
        self._clock = clock
        self.started = clock()
        self.all = Tally()
        self.models: dict[str, Tally] = {}

    def model_label(self, model: str | None) -> str | None:
        """The bounded name ``model`` is counted under (None: the request named no model)."""
        if model is None:
            return None
        return model if self._known(model) else OTHER_MODEL

    def observe(self, event: object) -> None:
        if isinstance(event, RequestFinished):
            self.add(event, self.model_label(event.model))

    def add(self, event: RequestFinished, label: str | None) -> None:
        """Count ``event`` under ``label`` (its :meth:`model_label`, which the caller already
        has: the label is a lookup, asked once an answer)."""
        if event.route in MONITORING_ROUTES:
            return
        self.all.add(event)
        if label is not None:
            self.models.setdefault(label, Tally()).add(event)

    def snapshot(self) -> dict[str, Any]:
        """``GET /api/v1/metrics``'s body (documented in the README)."""
        return {
            "uptime_s": round(self._clock() - self.started, 3),
            **self.all.as_dict(),
            "models": {name: t.as_dict() for name, t in sorted(self.models.items())},
        }
