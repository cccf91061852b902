"""The bridge delivers loop results and core events on the GUI thread."""

from __future__ import annotations

import asyncio
import gc
import threading
import warnings
import weakref

from PySide6.QtCore import QObject, Slot
from pytestqt.qtbot import QtBot

from app.core.events import ModelLoaded, RequestFinished
from app.core.util.loop import LoopThread
from app.errors import ModelNotFound
from app.gui.bridge import Bridge, error_text
from app.gui.context import GuiContext


class Recorder(QObject):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[object, ...]] = []
        self.threads: list[threading.Thread] = []

    @Slot(str, int, float)
    def on_loaded(self, *args: object) -> None:
        self.calls.append(args)
        self.threads.append(threading.current_thread())

    @Slot(object)
    def on_request(self, event: object) -> None:
        self.calls.append((event,))
        self.threads.append(threading.current_thread())


def test_run_delivers_results_and_errors_on_the_gui_thread(
    qtbot: QtBot, bridge: Bridge, gui_ctx: GuiContext
) -> None:
    out: list[tuple[str, object, threading.Thread]] = []

    async def answer() -> int:
        await asyncio.sleep(0.01)
        assert threading.current_thread() is not threading.main_thread()
        return 42

    async def fail() -> None:
        raise ModelNotFound("The model 'x' does not exist")

    bridge.run(answer(), on_done=lambda v: out.append(("done", v, threading.current_thread())))
    bridge.run(
        fail(), on_error=lambda e: out.append(("error", error_text(e), threading.current_thread()))
    )
    qtbot.waitUntil(lambda: len(out) == 2, timeout=10_000)
    assert sorted(o[:2] for o in out) == [("done", 42), ("error", "The model 'x' does not exist")]
    assert all(o[2] is threading.main_thread() for o in out)


def test_a_callbacks_owner_is_released_on_the_gui_thread(qtbot: QtBot, bridge: Bridge) -> None:
    """The loop thread never holds a run's callbacks: a widget whose last reference is its
    callback is let go on the GUI thread, not by the finished future on the loop thread (Qt
    objects destroyed there warn "Timers cannot be stopped from another thread" and can crash
    the app later)."""
    release = threading.Event()
    freed: list[threading.Thread] = []
    got: list[object] = []

    class Owner:
        def on_done(self, value: object) -> None:
            got.append(value)

    async def gated() -> str:
        await asyncio.to_thread(release.wait, 30)
        return "read"

    owner = Owner()
    weakref.finalize(owner, lambda: freed.append(threading.current_thread()))
    future = bridge.run(gated(), on_done=owner.on_done)  # a caller may keep its future
    del owner
    release.set()
    qtbot.waitUntil(lambda: bool(got), timeout=10_000)
    assert got == ["read"] and future.done()
    gc.collect()
    assert freed == [threading.main_thread()], "the owner was freed on the GUI thread"


def test_call_runs_on_the_loop_thread_and_never_reenters(qtbot: QtBot, bridge: Bridge) -> None:
    out: list[str] = []
    bridge.call(lambda: threading.current_thread().name, on_done=out.append)
    assert out == []  # delivered later, through the event queue
    qtbot.waitUntil(lambda: out == ["test-service"], timeout=10_000)


def test_core_events_become_queued_signals(
    qtbot: QtBot, bridge: Bridge, gui_ctx: GuiContext
) -> None:
    rec = Recorder()
    bridge.model_loaded.connect(rec.on_loaded)
    bridge.request_finished.connect(rec.on_request)
    finished = RequestFinished("GET", "/v1/models", 200, None, 0, 0, 0.01, 0.0)

    async def publish() -> None:
        gui_ctx.service.events.publish(ModelLoaded("m", 2048, 0.5))
        gui_ctx.service.events.publish(finished)

    gui_ctx.loop.call(publish(), timeout=10)
    qtbot.waitUntil(lambda: len(rec.calls) == 2, timeout=10_000)
    assert rec.calls == [("m", 2048, 0.5), (finished,)]
    assert all(t is threading.main_thread() for t in rec.threads)

    bridge.close()  # no more signals after close
    gui_ctx.loop.call(publish(), timeout=10)
    qtbot.wait(200)
    assert len(rec.calls) == 2


def test_run_after_close_or_loop_stop_does_nothing(qtbot: QtBot, gui_ctx: GuiContext) -> None:
    # a page's timer may fire after the service stopped (window teardown, quit): never an error
    ran: list[str] = []

    async def work() -> None:
        ran.append("ran")

    b = Bridge(gui_ctx.loop, gui_ctx.service.events)
    b.close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the dropped coroutine is closed, not left un-awaited
        assert b.run(work()).cancelled()
    stopped = LoopThread("stopped").start()
    stopped.stop()
    b2 = Bridge(stopped, gui_ctx.service.events)
    try:
        assert b2.call(ran.append, "called").cancelled()
    finally:
        b2.close()
    qtbot.wait(100)
    assert ran == []
