"""The stops an editor asks of an infill, as llama-server applies them: after ``max_predict_ms``
since the first token, at the next new line (a completion of whole lines, in time); and at a new
line indented less than ``indent`` (the completion left the block), that line's text cut.
Either ends the generation as a length stop. Tested by tests/core/inference/fim/test_limits.py."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from dataclasses import replace

from app.core.types import Delta, GenerationStream

# an infill's queue priority at most (lower is served first; a request's own 0 by default):
# an editor's completion is worthless after the next keystroke, so its prompt is read before
# others' long ones, however long an answer it allows (app/runtimes/worker.py interactive)
INFILL_PRIORITY = -1


class InfillStops:
    """A generation stream with the infill stops applied (a GenerationStream itself)."""

    def __init__(
        self,
        stream: GenerationStream,
        *,
        max_predict_ms: float | None = None,
        indent: int = 0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._stream = stream
        self._limit_s = max_predict_ms / 1000 if max_predict_ms and max_predict_ms > 0 else None
        self._indent = max(0, indent)
        self._clock = clock
        self._started: float | None = None
        self._seen_newline = False
        self._line_start = False  # at the start of a line, before its first non-blank
        self._blanks = 0

    def cancel(self) -> None:
        self._stream.cancel()

    def __aiter__(self) -> AsyncIterator[Delta]:
        return self._run()

    def _cut(self, text: str) -> int | None:
        """Where a line indented less than ``indent`` starts its text in ``text``, or None."""
        for i, c in enumerate(text):
            if c == "\n":
                self._seen_newline, self._line_start, self._blanks = True, True, 0
            elif self._line_start:
                if c in " \t":
                    self._blanks += 1
                    continue
                self._line_start = False
                if self._indent and self._blanks < self._indent:
                    return i
        return None

    def _late(self, text: str) -> bool:
        if self._limit_s is None or self._started is None or "\n" not in text:
            return False
        return self._clock() - self._started > self._limit_s

    async def _run(self) -> AsyncIterator[Delta]:
        deltas = aiter(self._stream)  # one iterator: the tail is drained from it after a stop
        async for d in deltas:
            if self._started is None and (d.text or d.token_count):
                self._started = self._clock()
            cut = self._cut(d.text)
            stop = cut is not None or self._late(d.text)
            text = d.text if cut is None else d.text[:cut]
            if d.finish_reason is not None:
                yield replace(d, text=text, finish_reason="length") if stop else d
                return
            if not stop:
                yield d
                continue
            if text:
                yield replace(d, text=text, logprobs=d.logprobs if cut is None else ())
            self._stream.cancel()
            async for tail in deltas:
                if tail.finish_reason is not None:
                    # the runtime's count and timings; the stop is the limit's, not a cancel
                    yield replace(tail, text="", finish_reason="length", error_code=None)
                    return
