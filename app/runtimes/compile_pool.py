"""A few threads, apart from every model's worker, for the CPU work a request needs before it
reaches its model: converting a JSON schema into a grammar and compiling it.

A model's worker thread decodes every running stream of that model, so work done there stalls
them all: three schemas converting on it froze a running stream for 28.7 s. Here the work waits
for one of :data:`MAX_THREADS` threads instead, with the stack size the grammar bounds are
chosen for (:data:`app.runtimes.worker.THREAD_STACK_BYTES`: llama.cpp's grammar parser
recurses). Idle threads end after :data:`IDLE_SECONDS`, so a server with no constraints keeps
none.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from app.runtimes.worker import start_thread

T = TypeVar("T")

MAX_THREADS = 2  # the schema bounds keep one job well under a second; two let a second wait less
IDLE_SECONDS = 30.0

_Job = tuple[concurrent.futures.Future[Any], Callable[[], Any]]


class CompilePool:
    """Runs callables on up to ``threads`` threads of its own; ``await pool.run(fn)``."""

    def __init__(self, *, threads: int = MAX_THREADS, name: str = "hearth-compile") -> None:
        self.max_threads = threads
        self.name = name
        self._jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self._lock = threading.Lock()  # a job is queued and a thread ends under it: none strands
        self._threads = 0
        self._started = 0

    async def run(self, fn: Callable[[], T]) -> T:
        """``fn()`` on one of the pool's threads. A caller that stops waiting (cancelled)
        takes its job out if it has not started yet.

        Raises:
            whatever ``fn`` raises.
        """
        fut: concurrent.futures.Future[T] = concurrent.futures.Future()
        with self._lock:
            self._jobs.put((fut, fn))
            if self._threads < self.max_threads:
                self._threads += 1
                self._started += 1
                start_thread(self._serve, name=f"{self.name}-{self._started}")
        return await asyncio.wrap_future(fut)

    @property
    def threads(self) -> int:
        """How many threads the pool has now."""
        with self._lock:
            return self._threads

    def _serve(self) -> None:
        while True:
            try:
                fut, fn = self._jobs.get(timeout=IDLE_SECONDS)
            except queue.Empty:
                with self._lock:
                    if self._jobs.empty():
                        self._threads -= 1
                        return
                continue
            if not fut.set_running_or_notify_cancel():
                continue  # its request is gone
            try:
                fut.set_result(fn())
            except BaseException as e:  # handed to the awaiting request, which raises it
                fut.set_exception(e)


# the process's one pool: the constraints of every model's requests share its threads
COMPILE_POOL = CompilePool()
