"""Typed events and a tiny publish/subscribe hub. The GUI and the server's live log listen here.
Tested by tests/core/hub/test_downloads.py and tests/core/library/test_stores.py."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Event:
    at: float = field(default_factory=time.time, kw_only=True)


@dataclass(frozen=True, slots=True)
class LibraryChanged(Event):
    pass


@dataclass(frozen=True, slots=True)
class ProvidersChanged(Event):
    """A remote provider's state or model list changed (or the providers file did)."""


@dataclass(frozen=True, slots=True)
class ModelLoading(Event):
    model_id: str


@dataclass(frozen=True, slots=True)
class ModelLoaded(Event):
    model_id: str
    context_length: int
    load_seconds: float


@dataclass(frozen=True, slots=True)
class ModelUnloaded(Event):
    model_id: str


@dataclass(frozen=True, slots=True)
class ModelLoadFailed(Event):
    model_id: str
    message: str


@dataclass(frozen=True, slots=True)
class ServerStarted(Event):
    host: str
    port: int
    base_url: str


@dataclass(frozen=True, slots=True)
class ServerStopped(Event):
    reason: str = ""


@dataclass(frozen=True, slots=True)
class RequestFinished(Event):
    """One HTTP request, for the live log (never the prompt's content)."""

    method: str
    path: str
    status: int
    model: str | None
    prompt_tokens: int
    completion_tokens: int
    seconds: float
    tokens_per_second: float  # decode speed the runtime measured; 0 when not a generation
    prompt_tokens_per_second: float = 0.0  # prompt processing speed (uncached tokens only)
    cached_tokens: int = 0  # prompt tokens reused from the prompt cache
    batch_size: float = 0.0  # sequences decoded together per step, on average (0: unknown)
    cpu_busy: bool = False  # decoded with fewer threads: other programs kept the CPU busy
    route: str = ""  # the matched route's pattern (``/v1/models/{model_id}``); "" for none
    ttft_ms: float | None = None  # arrival to the first generated token; None: no generation
    arrived_at: float = 0.0  # wall clock at arrival: its request record's ``time`` (0: unknown)


# -- downloads (app.core.hub.downloads.DownloadManager publishes these) ----------------------------
@dataclass(frozen=True, slots=True)
class DownloadQueued(Event):
    download_id: str
    repo_id: str
    name: str  # the file (or MLX folder) being pulled
    total_bytes: int


@dataclass(frozen=True, slots=True)
class DownloadProgressed(Event):
    """Throttled (a few per second per download) while bytes arrive, and on each state change."""

    download_id: str
    state: str  # queued | downloading | stalled | retrying | verifying | paused | ...
    bytes_done: int
    total_bytes: int
    speed_bps: float
    eta_s: float | None
    file: str  # the repo file being transferred now


@dataclass(frozen=True, slots=True)
class DownloadStalled(Event):
    """No bytes for the stall timeout, or the connection broke: retrying after a backoff."""

    download_id: str
    attempt: int
    retry_in_s: float
    reason: str


@dataclass(frozen=True, slots=True)
class DownloadPaused(Event):
    download_id: str
    bytes_done: int


@dataclass(frozen=True, slots=True)
class DownloadResumed(Event):
    download_id: str


@dataclass(frozen=True, slots=True)
class DownloadFinished(Event):
    download_id: str
    model_id: str
    path: str


@dataclass(frozen=True, slots=True)
class DownloadFailed(Event):
    download_id: str
    message: str
    code: str | None


@dataclass(frozen=True, slots=True)
class DownloadCancelled(Event):
    download_id: str


Listener = Callable[[Event], Any]


class EventHub:
    """Synchronous fan-out. Listeners must be quick and must not raise (errors are logged)."""

    def __init__(self) -> None:
        self._listeners: list[Listener] = []
        self._lock = threading.Lock()

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        with self._lock:
            self._listeners.append(listener)

        def unsubscribe() -> None:
            with self._lock:
                if listener in self._listeners:
                    self._listeners.remove(listener)

        return unsubscribe

    def publish(self, event: Event) -> None:
        with self._lock:
            listeners = list(self._listeners)
        for fn in listeners:
            try:
                fn(event)
            except Exception:
                log.exception("event listener %r failed on %s", fn, type(event).__name__)
