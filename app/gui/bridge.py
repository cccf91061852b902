"""Bridge: core events become Qt signals, and coroutines run on the service loop with results
delivered back on the GUI thread."""

from __future__ import annotations

import concurrent.futures
import itertools
import logging
from collections.abc import Callable, Coroutine
from functools import partial
from typing import Any, TypeVar

from PySide6.QtCore import QObject, Qt, Signal

from app.core import events as ev
from app.core.util.loop import LoopThread
from app.errors import HearthError

log = logging.getLogger(__name__)
T = TypeVar("T")

DOWNLOAD_EVENTS = (
    ev.DownloadQueued,
    ev.DownloadProgressed,
    ev.DownloadStalled,
    ev.DownloadPaused,
    ev.DownloadResumed,
    ev.DownloadFinished,
    ev.DownloadFailed,
    ev.DownloadCancelled,
)

DoneCallback = Callable[[Any], None]
ErrorCallback = Callable[[BaseException], None]


def error_text(exc: BaseException) -> str:
    """What the user reads for a failure: our own message for HearthErrors, the type otherwise."""
    if isinstance(exc, HearthError):
        return exc.message
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def log_failure(logger: logging.Logger, what: str, exc: BaseException) -> str:
    """Log a failure the GUI is about to show: expected errors briefly, bugs with a traceback.
    Returns the text to show."""
    text = error_text(exc)
    if isinstance(exc, HearthError):
        logger.info("%s: %s", what, text)
    else:
        logger.error("%s", what, exc_info=exc)
    return text


class Bridge(QObject):
    """Lives on the GUI thread. Signals emitted here from the loop thread arrive queued."""

    library_changed = Signal()
    model_loading = Signal(str)
    model_loaded = Signal(str, int, float)  # model id, context length, load seconds
    model_unloaded = Signal(str)
    model_load_failed = Signal(str, str)  # model id, message
    server_started = Signal(str, int, str)  # host, port, base url
    server_stopped = Signal(str)  # reason
    request_finished = Signal(object)  # app.core.events.RequestFinished
    download_changed = Signal(object)  # any app.core.events.Download* event
    providers_changed = Signal()  # a remote provider's state or models changed
    # internal: (key, future) of a finished run, for its callbacks on the GUI thread
    _completed = Signal(object)

    def __init__(
        self, loop: LoopThread, events: ev.EventHub, parent: QObject | None = None
    ) -> None:
        super().__init__(parent)
        self._loop = loop
        self._closed = False
        # each run's callbacks, kept here on the GUI thread by a key: the loop thread only ever
        # holds the key. A callback holds its widget (a bound method, a lambda over self); held
        # by the future, it could drop a widget's last reference on the loop thread, and a Qt
        # object destroyed there ("Timers cannot be stopped from another thread") can crash
        # the app later
        self._pending: dict[int, tuple[DoneCallback | None, ErrorCallback | None]] = {}
        self._keys = itertools.count()
        # queued even when the future is already done at add_done_callback time, so callers
        # always get their callback after run() returns, never re-entrantly inside it
        self._completed.connect(self._on_self_completed, Qt.ConnectionType.QueuedConnection)
        self._unsubscribe = events.subscribe(self._on_service_event)

    # -- coroutines ----------------------------------------------------------------------------
    def run(
        self,
        coro: Coroutine[Any, Any, T],
        on_done: Callable[[T], None] | None = None,
        on_error: ErrorCallback | None = None,
    ) -> concurrent.futures.Future[T]:
        """Run ``coro`` on the service loop; call ``on_done(result)`` or ``on_error(exc)`` later
        on the GUI thread. Without ``on_error`` a failure is logged.

        After ``close()`` (or once the loop has stopped) nothing runs: the coroutine is closed
        and the returned future is cancelled, so timers that outlive the service stay harmless.
        """
        if self._closed or not self._loop.running:
            coro.close()
            dropped: concurrent.futures.Future[T] = concurrent.futures.Future()
            dropped.cancel()
            return dropped
        try:
            future = self._loop.submit(coro)
        except RuntimeError:  # the loop closed between the check and the submit
            coro.close()
            dropped = concurrent.futures.Future()
            dropped.cancel()
            return dropped
        key = next(self._keys)
        self._pending[key] = (on_done, on_error)
        future.add_done_callback(partial(self._on_future_done, key))
        return future

    def call(
        self,
        fn: Callable[..., T],
        *args: Any,
        on_done: Callable[[T], None] | None = None,
        on_error: ErrorCallback | None = None,
    ) -> concurrent.futures.Future[T]:
        """Run a quick synchronous core function (file reads, library index) on the loop thread,
        where the core's state lives, so the GUI thread never touches files."""

        async def _call() -> T:
            return fn(*args)

        return self.run(_call(), on_done, on_error)

    def close(self) -> None:
        """Stop listening to the core; late results are dropped."""
        self._closed = True
        self._unsubscribe()
        self._pending.clear()

    def _on_future_done(self, key: int, future: concurrent.futures.Future[Any]) -> None:
        # runs on the loop thread (or right here when already done)
        if self._closed:
            return
        try:
            self._completed.emit((key, future))
        except RuntimeError:  # the C++ object is gone: the window was torn down
            log.debug("bridge deleted; dropping a late result")

    def _on_self_completed(self, done: tuple[int, concurrent.futures.Future[Any]]) -> None:
        key, future = done
        callbacks = self._pending.pop(key, None)
        if callbacks is not None and not self._closed:
            _deliver(future, *callbacks)

    # -- events ----------------------------------------------------------------------------------
    def _on_service_event(self, event: ev.Event) -> None:
        # runs on the loop thread; only emits (queued to the GUI thread)
        if self._closed:
            return
        try:
            if isinstance(event, ev.LibraryChanged):
                self.library_changed.emit()
            elif isinstance(event, ev.ModelLoading):
                self.model_loading.emit(event.model_id)
            elif isinstance(event, ev.ModelLoaded):
                self.model_loaded.emit(event.model_id, event.context_length, event.load_seconds)
            elif isinstance(event, ev.ModelUnloaded):
                self.model_unloaded.emit(event.model_id)
            elif isinstance(event, ev.ModelLoadFailed):
                self.model_load_failed.emit(event.model_id, event.message)
            elif isinstance(event, ev.ServerStarted):
                self.server_started.emit(event.host, event.port, event.base_url)
            elif isinstance(event, ev.ServerStopped):
                self.server_stopped.emit(event.reason)
            elif isinstance(event, ev.RequestFinished):
                self.request_finished.emit(event)
            elif isinstance(event, ev.ProvidersChanged):
                self.providers_changed.emit()
            elif isinstance(event, DOWNLOAD_EVENTS):
                self.download_changed.emit(event)
        except RuntimeError:
            log.debug("bridge deleted; dropping %s", type(event).__name__)


def _deliver(
    future: concurrent.futures.Future[Any],
    on_done: Callable[[Any], None] | None,
    on_error: ErrorCallback | None,
) -> None:
    """GUI thread: hand the outcome to the caller; a failing callback is logged, never raised
    into Qt (which would only print it)."""
    if future.cancelled():
        return
    exc = future.exception()
    try:
        if exc is not None:
            if on_error is not None:
                on_error(exc)
            elif isinstance(exc, HearthError):
                log.warning("background task failed: %s", exc.message)
            else:
                log.error("background task failed", exc_info=exc)
        elif on_done is not None:
            on_done(future.result())
    except Exception:
        log.exception("GUI callback failed")
