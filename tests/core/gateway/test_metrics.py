"""app.core.gateway.metrics: nearest-rank percentiles, bounded per-model tallies, monitoring not counted."""

from __future__ import annotations

from app.core.events import ModelLoaded, RequestFinished
from app.core.gateway.metrics import TTFT_WINDOW, RequestMetrics, percentile


def finished(
    model: str | None, status: int = 200, ttft: float | None = None, **kw: object
) -> RequestFinished:
    base: dict[str, object] = {
        "method": "POST",
        "path": "/v1/chat/completions",
        "status": status,
        "model": model,
        "prompt_tokens": 3,
        "completion_tokens": 2,
        "seconds": 0.5,
        "tokens_per_second": 10.0,
        "route": "/v1/chat/completions",
        "ttft_ms": ttft,
    }
    base.update(kw)
    return RequestFinished(**base)  # type: ignore[arg-type]


def test_percentile_is_nearest_rank() -> None:
    assert percentile([], 50) is None
    assert percentile([5.0], 95) == 5.0
    values = [float(v) for v in range(1, 101)]  # 1..100
    assert percentile(values, 50) == 50.0 and percentile(values, 95) == 95.0
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0


def test_unknown_models_share_one_entry_and_ttft_window_is_bounded() -> None:
    t = [100.0]
    m = RequestMetrics(lambda mid: mid == "known", clock=lambda: t[0])
    for i in range(TTFT_WINDOW + 10):
        m.observe(finished("known", ttft=float(i)))
    for i in range(50):
        m.observe(finished(f"random-{i}", status=404, prompt_tokens=0, completion_tokens=0))
    m.observe(finished(None, path="/health", route="/health"))  # a probe: not traffic
    m.observe(ModelLoaded("known", 2048, 1.0))  # other events are ignored
    m.observe(finished(None, status=401, route="", tokens_per_second=0.0))
    t[0] = 112.5
    snap = m.snapshot()
    assert snap["uptime_s"] == 12.5
    assert set(snap["models"]) == {"known", "other"}
    n = TTFT_WINDOW + 10
    assert snap["requests"] == {"total": n + 51, "ok": n, "failed": 51}
    assert snap["models"]["other"]["requests"] == {"total": 50, "ok": 0, "failed": 50}
    assert snap["models"]["known"]["tokens"] == {"in": 3 * n, "out": 2 * n}
    assert len(m.models["known"].ttft_ms) == TTFT_WINDOW  # the oldest 10 fell out
    assert snap["models"]["known"]["ttft_ms"] == {"p50": 521.0, "p95": 982.0}
    # the mean decode speed of requests that decoded (the 401 with 0 tok/s is left out)
    assert snap["tokens_per_second"] == 10.0
