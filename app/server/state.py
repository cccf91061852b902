"""The server's typed state, in its own module so routes and the app factory need not import
each other.
Tested by tests/server/keys/test_named_keys_api.py."""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import TypeVar

from aiohttp import web

from app.core.inference.generation import Generation
from app.core.requests import (
    ChatRequest,
    CompletionRequest,
    EmbeddingRequest,
    RequestContext,
    RerankRequest,
    TranscriptionRequest,
)
from app.core.service import Hearth
from app.server.keyguard import KeyGuard
from app.settings import ServerSettings


@dataclass
class ServerState:
    """Per-server mutable state: the generations in flight (for a clean shutdown)."""

    settings: ServerSettings
    api_key_hashes: tuple[str, ...]
    bound_host: str
    active: set[Generation] = field(default_factory=set)
    inflight: int = 0
    stopping: bool = False
    started_at: float = field(default_factory=time.time)
    bound_addresses: tuple[str, ...] = ()  # what the listening sockets are bound to
    # /health's state (app/server/routes/health.py): startup steps after listening (the --model
    # preloads) run while ``starting``; the message of the one that failed
    starting: bool = False
    startup_error: str | None = None
    guard: KeyGuard | None = None  # named keys and rate limits; None: hashes only


SERVICE = web.AppKey("service", Hearth)
REQUEST_LOG = web.RequestKey("hearth_log", dict)
STATE = web.AppKey("state", ServerState)
CONTEXT = web.RequestKey("hearth_context", RequestContext)

Req = TypeVar(
    "Req",
    bound=ChatRequest | CompletionRequest | EmbeddingRequest | RerankRequest | TranscriptionRequest,
)


def context_of(request: web.Request) -> RequestContext:
    """The request's context: who it runs for (the key's scope, cache partition, rate limits),
    its cache directive and tracing, and what the core measures of it. The edge fills it."""
    ctx = request.get(CONTEXT)
    if ctx is None:
        ctx = request[CONTEXT] = RequestContext()
    return ctx


def scope_of(request: web.Request) -> tuple[str, ...] | None:
    """The caller's model patterns (None: every model)."""
    return context_of(request).models


def with_context(request: web.Request, req: Req) -> Req:
    """``req`` (as its protocol adapter parsed it) carrying this HTTP request's context."""
    return replace(req, context=context_of(request))
