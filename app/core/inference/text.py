"""Streaming text helpers shared by runtimes: stop strings that never reach the client."""

from __future__ import annotations

from collections.abc import Sequence


class StopMatcher:
    """Finds stop strings in streamed text and holds back what may be the start of one.

    ``feed`` returns the text that is safe to emit now and whether a stop string was hit; the
    stop string itself and anything after it are never emitted.
    """

    def __init__(self, stops: Sequence[str]) -> None:
        self._stops = tuple(s for s in stops if s)
        self._held = ""
        self.stopped = False
        self.matched: str | None = None  # the stop string that ended the stream

    def feed(self, text: str) -> tuple[str, bool]:
        if self.stopped:
            return "", True
        if not self._stops:
            return text, False
        buf = self._held + text
        cut = -1
        for s in self._stops:
            i = buf.find(s)
            if i != -1 and (cut == -1 or i < cut):
                cut = i
                self.matched = s
        if cut != -1:
            self.stopped = True
            self._held = ""
            return buf[:cut], True
        hold = 0
        for s in self._stops:
            for k in range(min(len(s) - 1, len(buf)), 0, -1):
                if buf.endswith(s[:k]):
                    hold = max(hold, k)
                    break
        self._held = buf[len(buf) - hold :] if hold else ""
        return buf[: len(buf) - hold], False

    def flush(self) -> str:
        """What was held back, once the stream ends without a stop string."""
        out, self._held = self._held, ""
        return "" if self.stopped else out
