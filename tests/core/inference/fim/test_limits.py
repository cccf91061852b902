"""An editor's stops on a generation: at the first new line after ``max_predict_ms`` since the
first token, and at a new line indented less than ``indent`` (that line's text cut). Driven by
recorded deltas and a clock the test moves; the real server's: tests/server/fim/."""

from __future__ import annotations

from collections.abc import AsyncIterator

from app.core.inference.fim import InfillStops
from app.core.types import Delta, Usage


class Recorded:
    """A runtime's stream of recorded deltas; once cancelled, it ends as a cancelled one."""

    def __init__(self, texts: list[str], now: list[float] | None = None) -> None:
        self.texts = texts
        self.cancelled = False
        self.now = now if now is not None else [0.0]

    def cancel(self) -> None:
        self.cancelled = True

    def __aiter__(self) -> AsyncIterator[Delta]:
        return self._run()

    async def _run(self) -> AsyncIterator[Delta]:
        for t in self.texts:
            if self.cancelled:
                break
            self.now[0] += 0.004  # a token every 4 ms
            yield Delta(text=t, token_count=1)
        n = sum(1 for _ in self.texts)
        yield Delta(finish_reason="cancelled" if self.cancelled else "stop", usage=Usage(3, n))


async def run(stops: InfillStops) -> list[Delta]:
    return [d async for d in stops]


async def test_late_it_stops_at_the_next_new_line() -> None:
    now = [0.0]
    inner = Recorded(["a", "b", "c\n", "d", "e\n", "f\n"], now)
    # the first token at 4 ms; "c\n" 8 ms after it (in time), "e\n" 16 ms after (late)
    out = await run(InfillStops(inner, max_predict_ms=10, clock=lambda: now[0]))
    assert "".join(d.text for d in out) == "abc\nde\n"
    assert out[-1].finish_reason == "length" and out[-1].usage is not None
    assert inner.cancelled


async def test_a_line_indented_less_ends_it_cut() -> None:
    inner = Recorded(["    x = 1", "\n    y", " = 2\n", "z = 3\n"])
    out = await run(InfillStops(inner, indent=4))
    assert "".join(d.text for d in out) == "    x = 1\n    y = 2\n"
    assert out[-1].finish_reason == "length" and inner.cancelled


async def test_in_time_and_indented_it_runs_to_its_end() -> None:
    inner = Recorded(["  a\n", "  b\n"])
    out = await run(InfillStops(inner, max_predict_ms=60_000, indent=2))
    assert "".join(d.text for d in out) == "  a\n  b\n"
    assert out[-1].finish_reason == "stop" and not inner.cancelled
