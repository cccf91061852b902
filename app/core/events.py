"""Typed events and a tiny publish/subscribe hub. The GUI and the server's live log listen here."""

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
    tokens_per_second: float


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
