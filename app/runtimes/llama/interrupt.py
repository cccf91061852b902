"""Stopping a decode in flight when an editor's keystroke arrives, so that it is read first.

A keystroke's request (an interactive one: app/runtimes/worker.py) that arrives while the worker
decodes waits for that decode to end: the running streams' step (~45-60 ms beside an agent and
two chats on 2 cores) or a piece of an agent's prompt (~0.15 s). The engine reads a keystroke's
few new tokens ahead of the streams' step (admission.py, ``_read_ahead``), so what it waited for
was the decode already under way. Now the arrival raises a flag that llama.cpp's abort callback
reads between the graph's nodes: the decode stops within a node, llama.cpp takes the micro-batch's
positions out of the cache, and the worker reads the keystroke first and that decode again after
it. What the stopped decode had computed is lost, so ``Interrupts`` stops only a decode that has
run less than half its typical time (past that, waiting for its end costs the keystroke less than
the others lose), and only while the work lost so stays under WASTE_SHARE of the worker's time
over the last WASTE_WINDOW_S. Either way the worker starts nothing more before it reads the
keystroke (a joining prompt's next piece waited too).

Measured with tests/bench/autocomplete_mix.py (75-90 s, 2 EPYC cores, against the commit before
in the same run, seven runs, two with the order swapped): the keystrokes' TTFT p50 0.67-0.81x,
p95 0.60-0.96x; the agent's turns 0.92-1.27x and the chats' tokens a second 0.86-1.23x (both
1.02x on average: this machine's spread from run to run, no direction); ~0.6 decodes stopped
a second, nearly all the streams' step, 1.1% of the work lost. Stopping whatever ran (no half-time rule, no
"nothing more") gave p50 0.61-0.81x and lost ~4%.

The callback is C, not Python: a Python callback is a GIL round trip per graph node (about a
thousand a decode), which doubled a short decode's time (admission.py, ``_abortable``). It is the C
library's ``strlen`` over a two-byte buffer: the flag byte and a terminating zero, so it returns 1
(true) once the flag is raised and 0 otherwise; ggml reads a ``bool`` from the return register's
low byte, which holds exactly that. The flag is up only while a decode that may stop runs.
Tested by tests/runtimes/llama/test_interrupt.py.
"""

from __future__ import annotations

import collections
import ctypes
import ctypes.util
import sys
import threading
import time
from typing import Any

from app.runtimes.llama.backend import L

# the share of the worker's time that stopped decodes may cost, over the last WASTE_WINDOW_S:
# beside an agent and two chats one keystroke every 0.7 s stops about one step (~25 ms of it
# computed on average), ~4%
WASTE_SHARE = 0.05
WASTE_WINDOW_S = 10.0
TYPICAL_WEIGHT = 0.2  # of the newest decode in the moving mean of a kind's time


def _strlen() -> Any:
    """The C library's strlen as a ggml_abort_callback, or None where it cannot be found."""
    try:
        libc = ctypes.cdll.msvcrt if sys.platform == "win32" else ctypes.CDLL(None)
        return ctypes.cast(libc.strlen, L.ggml_abort_callback)
    except (OSError, AttributeError):
        name = ctypes.util.find_library("c")
        if name is None:
            return None
        return ctypes.cast(ctypes.CDLL(name).strlen, L.ggml_abort_callback)


class Interrupts:
    """What an interactive arrival asks of the worker (``request``, on the event loop): the
    worker starts no more work before it reads that request (``waiting``), and the armed
    decode in flight stops (the flag is ``raised``) when it has run less than half its
    typical time and the work stopped decodes lost lately is under its bound; past half,
    waiting for its end costs the request less than stopping it costs the others.

    The callback is installed once, over one flag; only an ``arm``-ed decode (on the worker)
    can see it raised: the loop raises it, and the worker lowers it after the decode, under one
    lock, so a raise never reaches a decode that may not stop. (Setting llama.cpp's callback
    per decode logs a debug line through a Python callback each time: two more GIL round trips
    a decode on the worker.) ``clear`` runs where the worker looks at its queue."""

    def __init__(
        self, ctx: Any, *, share: float = WASTE_SHARE, window_s: float = WASTE_WINDOW_S
    ) -> None:
        self.ctx = ctx
        self.share, self.window_s = share, window_s
        self._callback = _strlen()
        self._flag = ctypes.create_string_buffer(2)  # the flag byte and strlen's end
        self.waiting = False
        self.fired = False  # whether the flag was up when the last armed decode ended
        self._kind = ""
        self._armed_at = 0.0  # when the armed decode started; 0: none runs
        self._ran = 0.0  # how long the last armed decode ran
        self._typical: dict[str, float] = {}  # an armed decode's time by kind (a moving mean)
        self._lost: collections.deque[tuple[float, float]] = collections.deque()  # (when, s)
        self._lost_s = 0.0
        self._lock = threading.Lock()
        self.stopped = 0  # decodes stopped so far
        self.available = self._callback is not None
        self.install()

    def install(self) -> None:
        """Put this flag's callback in place (again, after another was installed a while)."""
        if self.available:
            L.llama_set_abort_callback(self.ctx, self._callback, ctypes.addressof(self._flag))
        else:
            L.llama_set_abort_callback(self.ctx, L.ggml_abort_callback(), None)

    @property
    def raised(self) -> bool:
        return self._flag.raw[0] != 0

    def request(self) -> bool:
        """An interactive request arrived; whether the decode in flight stops for it (an
        armed decode that starts before the worker admits it stops at once: ``arm``)."""
        self.waiting = True
        now = time.monotonic()
        with self._lock:
            started, typical = self._armed_at, self._typical.get(self._kind)
            if not started or typical is not None and now - started > typical / 2:
                return False
            self._expire(now)
            if self._lost_s >= self.share * self.window_s:
                return False
            self._flag[0] = b"\x01"
        return True

    def clear(self) -> None:
        with self._lock:
            self.waiting = False
            self._flag[0] = b"\x00"

    def arm(self, kind: str) -> None:
        """The next decode (of ``kind``: what its typical time is kept by) may stop; at once
        if an interactive request waits already."""
        if not self.available:
            return
        with self._lock:
            self._kind = kind
            self._armed_at = time.monotonic()
            if self.waiting:
                self._flag[0] = b"\x01"

    def disarm(self) -> None:
        """After an armed decode: the flag goes down; ``fired`` says whether it was up."""
        if not self._armed_at:
            return
        with self._lock:
            self.fired = self.raised
            self._flag[0] = b"\x00"
            self._ran = time.monotonic() - self._armed_at
            self._armed_at = 0.0
        if not self.fired:  # it ran to its end
            old = self._typical.get(self._kind)
            self._typical[self._kind] = (
                self._ran if old is None else old + (self._ran - old) * TYPICAL_WEIGHT
            )

    def stopped_now(self) -> None:
        """The last armed decode was stopped by the flag: the time it ran is lost."""
        now = time.monotonic()
        with self._lock:
            self._lost.append((now, self._ran))
            self._lost_s += self._ran
            self._expire(now)
        self.stopped += 1

    def _expire(self, now: float) -> None:
        while self._lost and self._lost[0][0] < now - self.window_s:
            self._lost_s -= self._lost.popleft()[1]
