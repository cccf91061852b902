"""A few threads of its own for CPU work a request needs off the event loop and off every
model's worker: converting and compiling grammars, decoding images.

Work queued here cannot starve the loop's default executor (which /tokenize, file I/O and the
like share) nor stall a model's running streams. A job gets a ``stop`` flag: when the awaiting
request ends (client gone, time limit), a job not started yet is dropped and a running one sees
``stop()`` turn true. Idle threads end after :data:`IDLE_SECONDS`, so a pool nobody uses holds
none. Tested through its users: tests/server/edge/test_image_targets.py (a queued decode dropped
with its request) and tests/runtimes/test_grammar_limits.py (compiling off the worker and the
loop).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

IDLE_SECONDS = 30.0
Stop = Callable[[], bool]
_Job = tuple[concurrent.futures.Future[Any], Callable[[Stop], Any], threading.Event]


def _plain_thread(target: Callable[[], None], *, name: str) -> threading.Thread:
    thread = threading.Thread(target=target, name=name, daemon=True)
    thread.start()
    return thread


class JobPool:
    """Runs jobs on up to ``threads`` threads of its own; ``await pool.run(job)``.

    ``start`` starts a thread (a runtime passes one with a larger stack)."""

    def __init__(
        self,
        *,
        threads: int,
        name: str,
        start: Callable[..., threading.Thread] = _plain_thread,
    ) -> None:
        self.max_threads = threads
        self.name = name
        self.started = 0  # jobs that began running
        self._start = start
        self._jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self._lock = threading.Lock()  # a job is queued and a thread ends under it: none strands
        self._threads = 0
        self._spawned = 0

    async def run(self, job: Callable[[Stop], T]) -> T:
        """``job(stop)`` on one of the pool's threads. A caller that stops waiting (cancelled)
        takes its job out if it has not started yet, else sets its ``stop``.

        Raises:
            whatever ``job`` raises.
        """
        fut: concurrent.futures.Future[T] = concurrent.futures.Future()
        stop = threading.Event()
        with self._lock:
            self._jobs.put((fut, job, stop))
            if self._threads < self.max_threads:
                self._threads += 1
                self._spawned += 1
                self._start(self._serve, name=f"{self.name}-{self._spawned}")
        try:
            return await asyncio.wrap_future(fut)
        except asyncio.CancelledError:
            stop.set()  # the wrapped future was cancelled too: dropped if it had not started
            raise

    @property
    def threads(self) -> int:
        """How many threads the pool has now."""
        with self._lock:
            return self._threads

    def _serve(self) -> None:
        while True:
            try:
                fut, job, stop = self._jobs.get(timeout=IDLE_SECONDS)
            except queue.Empty:
                with self._lock:
                    if self._jobs.empty():
                        self._threads -= 1
                        return
                continue
            if not fut.set_running_or_notify_cancel():
                continue  # its request is gone
            with self._lock:
                self.started += 1
            try:
                fut.set_result(job(stop.is_set))
            except BaseException as e:  # handed to the awaiting request, which raises it
                fut.set_exception(e)
