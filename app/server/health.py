"""``GET /health``: whether this server can take requests now, for load balancers and probes.

``state`` is one of (first that applies):
- ``shutting_down`` (503): a graceful stop is under way (in-flight requests are ending);
- ``error`` (503): a startup step failed (a ``hearth serve --model`` preload); ``error`` says why;
- ``starting``: startup steps after listening are still running (the ``--model`` preloads);
- ``busy``: every loaded model's queue is full (a new request would get 429 at once);
- ``ready``: otherwise.
"""

from __future__ import annotations

from typing import Any, Literal

from aiohttp import web

from app import __version__
from app.core.service import Hearth
from app.server.state import SERVICE, STATE, ServerState

HealthState = Literal["starting", "ready", "busy", "error", "shutting_down"]
UNAVAILABLE: frozenset[HealthState] = frozenset({"error", "shutting_down"})


def full_queues(service: Hearth) -> tuple[int, int]:
    """``(loaded models, those whose queue is full)``; a model that cannot tell is not full."""
    loaded = [service.scheduler.loaded_model(i.model_id) for i in service.loaded()]
    models = [m for m in loaded if m is not None]
    return len(models), sum(1 for m in models if getattr(m, "queue_full", False))


def health_state(state: ServerState, service: Hearth) -> HealthState:
    if state.stopping:
        return "shutting_down"
    if state.startup_error is not None:
        return "error"
    if state.starting:
        return "starting"
    loaded, full = full_queues(service)
    return "busy" if loaded and full == loaded else "ready"


def health_body(app: web.Application) -> tuple[dict[str, Any], int]:
    """The /health body and its HTTP status (503 while shutting down or after a failed start)."""
    service, state = app[SERVICE], app[STATE]
    current = health_state(state, service)
    body: dict[str, Any] = {
        "status": "unavailable" if current in UNAVAILABLE else "ok",
        "state": current,
        "version": __version__,
        "loaded": [i.model_id for i in service.loaded()],
        "loading": service.loading(),
        "providers": service.providers.states() if service.providers is not None else [],
    }
    if state.startup_error is not None:
        body["error"] = state.startup_error
    return body, 503 if current in UNAVAILABLE else 200
