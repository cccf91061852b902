"""``GET /health``: whether this server can take requests now, for load balancers and probes.

``state`` is one of (first that applies):
- ``shutting_down`` (503): a graceful stop is under way (in-flight requests are ending);
- ``error`` (503): a startup step failed (a ``hearth serve --model`` preload); ``error`` says why;
- ``starting``: startup steps after listening are still running (the ``--model`` preloads);
- ``busy``: every loaded model's queue is full (a new request would get 429 at once);
- ``ready``: otherwise.

With shared state (``hearth serve --state``), ``shared_state`` says how it is (``backend``,
``url`` without its password, ``state`` ok or degraded, ``since``, ``errors``, and ``error``
while degraded), and ``status`` is ``degraded`` while Redis is unreachable: still HTTP 200,
since this gateway keeps serving on its local state and a load balancer must not drop every
gateway of a team because their Redis is down.
Tested by tests/server/routes/test_health.py and tests/e2e/shared_state/test_degraded.py."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from aiohttp import web

from app import __version__
from app.core.service import Hearth
from app.core.util import access
from app.errors import Unauthorized
from app.server.keyguard import token_from
from app.server.state import SERVICE, STATE, ServerState
from app.settings import key_matches

HealthState = Literal["starting", "ready", "busy", "error", "shutting_down"]
UNAVAILABLE: frozenset[HealthState] = frozenset({"error", "shutting_down"})


def full_queues(service: Hearth) -> tuple[int, int]:
    """``(loaded models, those whose queue is full)``; a model that cannot tell is not full."""
    loaded = service.models.loaded()
    return len(loaded), sum(1 for i in loaded if i.queue_full)


def health_state(state: ServerState, service: Hearth) -> HealthState:
    if state.stopping:
        return "shutting_down"
    if state.startup_error is not None:
        return "error"
    if state.starting:
        return "starting"
    loaded, full = full_queues(service)
    return "busy" if loaded and full == loaded else "ready"


def model_filter(request: web.Request) -> Callable[[str], bool]:
    """Which model ids /health may name to this caller. /health needs no key (probes), so
    where keys are required, a caller without a valid one is told no model ids, and a key
    limited to some models is told only those."""
    state = request.app[STATE]
    token = token_from(request)
    if state.guard is not None:
        try:
            caller = state.guard.identify(token)
        except Unauthorized:
            return lambda _id: False
        return lambda i: access.in_scope(i, caller.models)
    if state.api_key_hashes and not (token and key_matches(token, state.api_key_hashes)):
        return lambda _id: False
    return lambda _id: True


def health_body(
    app: web.Application, visible: Callable[[str], bool] = lambda _id: True
) -> tuple[dict[str, Any], int]:
    """The /health body and its HTTP status (503 while shutting down or after a failed start);
    ``loaded`` and ``loading`` list the model ids ``visible`` passes."""
    service, state = app[SERVICE], app[STATE]
    current = health_state(state, service)
    body: dict[str, Any] = {
        "status": "unavailable" if current in UNAVAILABLE else "ok",
        "state": current,
        "version": __version__,
        "loaded": [i.model_id for i in service.models.loaded() if visible(i.model_id)],
        "loading": [i for i in service.models.loading() if visible(i)],
        "providers": service.routing.provider_states(),
    }
    if state.startup_error is not None:
        body["error"] = state.startup_error
    if service.shared is not None:
        body["shared_state"] = service.shared.status()
        if body["status"] == "ok" and not service.shared.healthy:
            body["status"] = "degraded"
    return body, 503 if current in UNAVAILABLE else 200
