"""The service loop thread: running coroutines from other threads, and a clean stop."""

from __future__ import annotations

import asyncio
import gc
import threading
import warnings

import pytest

from app.core.util.loop import LoopThread


def test_call_runs_on_the_loop_thread() -> None:
    lt = LoopThread("t-loop").start()
    try:

        async def where() -> str:
            return threading.current_thread().name

        assert lt.call(where(), timeout=5) == "t-loop"
    finally:
        lt.stop()
    assert not lt.running


def test_stop_cancels_pending_work_instead_of_destroying_it(
    recwarn: pytest.WarningsRecorder,
) -> None:
    lt = LoopThread().start()
    started = threading.Event()
    seen: list[str] = []

    async def forever() -> None:
        started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            seen.append("cancelled")  # cleanup code runs
            raise

    fut = lt.submit(forever())
    assert started.wait(5)
    lt.stop(timeout=5)
    assert not lt.running
    assert seen == ["cancelled"] and fut.cancelled()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gc.collect()
