"""Decode threads that follow the machine's load. A desktop app shares the CPU: with another
program busy on one of two cores, llama.cpp decoding on both ran at a quarter of its quiet
speed (its threads wait for the one that is descheduled at every step), while one thread kept
~55% of it. With "auto" threads the engine decodes with the physical cores while that is the
fastest, and the tuner moves it to fewer (or back) when measured step times say so.

Pure bookkeeping over measured step times (no llama here): windows of ``WINDOW`` decode steps
of one shape (batch size, and context length in buckets of ``CONTEXT_BUCKET`` tokens: a step
attends over the whole context, so a long one is slower on a quiet machine too) give a mean
step time; a slowed window (or, now and then, a scheduled
exploration) tries one thread fewer or more for one window and keeps what was faster."""

from __future__ import annotations

from dataclasses import dataclass, field

WINDOW = 16  # decode steps per measurement
SLOW = 1.35  # a window this much slower than the best seen at this thread count: contention
GAIN = 0.92  # a trial must be at least 8% faster to be kept
EXPLORE_EVERY = 24  # windows between tries of one thread more while below the maximum
CONTEXT_BUCKET = 512  # tokens: steps this far apart in context length are timed apart


@dataclass(slots=True)
class ThreadTuner:
    """``observe(seconds, batch, context)`` after each decode step; a returned int is the thread count
    to use from the next step on (the caller applies it)."""

    max_threads: int
    current: int = 0
    _best: dict[tuple[int, tuple[int, int]], float] = field(default_factory=dict)
    _steps: int = 0
    _sum: float = 0.0
    _shape: tuple[int, int] = (0, 0)
    _trial_from: int | None = None  # the count a trial window left, with its last mean
    _trial_base: float = 0.0
    _windows_since_explore: int = 0
    changes: int = 0

    def __post_init__(self) -> None:
        self.max_threads = max(1, self.max_threads)
        if not self.current:
            self.current = self.max_threads

    def observe(self, seconds: float, batch: int, context: int = 0) -> int | None:
        """One decode step of ``batch`` sequences, the longest at ``context`` tokens."""
        shape = (batch, context // CONTEXT_BUCKET)
        if shape != self._shape:  # another shape costs differently: start a new window
            self._shape, self._steps, self._sum = shape, 0, 0.0
            if self._trial_from is not None:
                # a trial is judged against its own shape only: cut short, it goes back (a
                # trial begun late in a batch of 8 streams was judged on the next request's
                # one-stream steps, "faster", and kept one thread on a quiet machine)
                back, self._trial_from = self._trial_from, None
                return self._set(back)
        self._steps += 1
        self._sum += seconds
        if self._steps < WINDOW:
            return None
        mean = self._sum / self._steps
        self._steps, self._sum = 0, 0.0
        return self._window(mean, shape)

    def _window(self, mean: float, shape: tuple[int, int]) -> int | None:
        key = (self.current, shape)
        best = self._best.get(key)
        self._best[key] = mean if best is None else min(best, mean)
        if self._trial_from is not None:  # a trial window ended: keep it or go back
            back, base = self._trial_from, self._trial_base
            self._trial_from = None
            if mean < base * GAIN:
                return None  # the trial is faster: it stays
            # slower everywhere (a longer context, a bigger batch): the slowed time is the new
            # normal for that count, or every other window would be another trial
            self._best[(back, shape)] = base
            return self._set(back)
        self._windows_since_explore += 1
        if self.current > 1 and best is not None and mean > best * SLOW:
            return self._try(self.current - 1, mean)  # slowed down: fewer threads?
        if self.current < self.max_threads and self._windows_since_explore >= EXPLORE_EVERY:
            self._windows_since_explore = 0
            return self._try(self.current + 1, mean)  # the load may have gone
        return None

    def _try(self, threads: int, base: float) -> int:
        self._trial_from, self._trial_base = self.current, base
        return self._set(threads)

    def _set(self, threads: int) -> int:
        if threads != self.current:
            self.changes += 1
        self.current = threads
        return threads
