"""What the core measures for the request being served: the wait for its model to load.

The server starts a :class:`RequestTiming` in each request's task (a context variable, so the
core needs no request object); the core adds to it where it waits. Outside a request (the GUI's
chat, tests) there is none and nothing is measured.
"""

from __future__ import annotations

import contextlib
import contextvars
import time
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(slots=True)
class RequestTiming:
    load_ms: float | None = None  # None: the request never needed a model
    load_started_ns: int | None = None  # time.time_ns() its first wait began (a span's start)


_CURRENT: contextvars.ContextVar[RequestTiming | None] = contextvars.ContextVar(
    "hearth_request_timing", default=None
)


def begin() -> tuple[RequestTiming, contextvars.Token[RequestTiming | None]]:
    """A fresh timing for the request running in this task (``end`` with the token)."""
    t = RequestTiming()
    return t, _CURRENT.set(t)


def end(token: contextvars.Token[RequestTiming | None]) -> None:
    _CURRENT.reset(token)


@contextlib.contextmanager
def load_wait() -> Iterator[None]:
    """Time the block as waiting for a model (a JIT load, or another request's load of it)."""
    t = _CURRENT.get()
    started = time.perf_counter()
    if t is not None and t.load_started_ns is None:
        t.load_started_ns = time.time_ns()
    try:
        yield
    finally:
        if t is not None:
            t.load_ms = (t.load_ms or 0.0) + (time.perf_counter() - started) * 1000
