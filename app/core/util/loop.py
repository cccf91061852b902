"""The service thread: one asyncio loop that owns the core, the server and all their state."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")


class LoopThread:
    """Runs an asyncio loop on a daemon thread; other threads submit coroutines to it."""

    def __init__(self, name: str = "hearth-service") -> None:
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> LoopThread:
        self._thread.start()
        self._ready.wait()
        return self

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(self._ready.set)
        try:
            self.loop.run_forever()
        finally:
            self.loop.close()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Schedule ``coro`` on the loop; the returned future is safe to wait on from any thread."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def call(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the loop and wait (never from the loop thread itself)."""
        if threading.current_thread() is self._thread:
            raise RuntimeError("LoopThread.call would deadlock on its own thread")
        return self.submit(coro).result(timeout)

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def stop(self, timeout: float = 10.0) -> None:
        """Cancel what is still running on the loop (a task left pending would be destroyed
        with a warning), then stop it and join the thread."""
        if not self._thread.is_alive():
            return
        try:
            self.submit(self._cancel_pending()).result(min(timeout, 5.0))
        except (concurrent.futures.TimeoutError, RuntimeError) as e:
            log.debug("loop stop: pending tasks not all cancelled: %r", e)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout)

    async def _cancel_pending(self) -> None:
        me = asyncio.current_task()
        tasks = [t for t in asyncio.all_tasks() if t is not me and not t.done()]
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=2.0)
