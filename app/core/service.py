"""Hearth: the core as the GUI, the server and the CLI see it.

Inference goes through the request pipeline (:mod:`app.core.gateway.pipeline`); the rest goes
to one service per concern: ``models`` (the library, presets, estimates, loads), ``routing``
(providers and aliases) and ``hub`` (downloads). :func:`assemble` wires them, once; the
composition root (``app/compose.py``) calls it with this machine's runtimes and files.
Tested by tests/core/engine/test_scheduler.py and tests/core/inference/test_prompt.py.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from app.core.engine.autofit import DEFAULT_MAX_AUTO_CONTEXT
from app.core.engine.models import ModelService
from app.core.engine.policy import SchedulerPolicy
from app.core.engine.presets import PresetStore
from app.core.engine.runner import LocalRunner
from app.core.engine.scheduler import ModelScheduler
from app.core.events import EventHub
from app.core.gateway import AliasStore, Gateway, Routing
from app.core.gateway.cache.replay import ResponseCache
from app.core.gateway.dispatch import Dispatch
from app.core.gateway.groups.router import GroupRouter
from app.core.gateway.groups.store import GroupStore
from app.core.gateway.pipeline import Embed, Pipeline, routed_embed
from app.core.gateway.providers.pool import ProviderPool
from app.core.gateway.response_store import ResponseStorage
from app.core.gateway.routing import RoutingService
from app.core.hub.downloads import DownloadManager
from app.core.inference.generation import Choices
from app.core.library.index import ModelLibrary
from app.core.library.stores import ForeignLocations
from app.core.requests import (
    ChatRequest,
    CompletionRequest,
    EmbeddingRequest,
    Embeddings,
    RequestContext,
    Reranking,
    RerankRequest,
    Transcription,
    TranscriptionRequest,
)
from app.core.types import LoadedModel, LoadOptions, Runtime
from app.errors import InvalidRequest

log = logging.getLogger(__name__)


class Hearth:
    """The application core. Lives on the service loop; every coroutine runs there."""

    def __init__(
        self,
        pipeline: Pipeline,
        models: ModelService,
        routing: RoutingService,
        events: EventHub,
        hub: DownloadManager | None = None,
        cache: ResponseCache | None = None,
        runtimes: Mapping[str, Runtime] | None = None,
        responses: ResponseStorage | None = None,
    ) -> None:
        self._pipeline = pipeline
        self.models = models
        self.routing = routing
        self.events = events
        self.hub = hub  # Hub downloads (None where not wired); publishes on ``events``
        self.cache = cache or ResponseCache()
        self.runtimes = dict(runtimes or {})  # this machine's runtimes, by model format
        # the Responses API's kept responses (``store``); None: nothing is kept
        self.responses = responses
        # the Redis several gateways share (``hearth serve --state``; set by the composition
        # root, started by whoever serves); None: every piece stays in process
        self.shared: Any = None

    # -- inference: the pipeline -----------------------------------------------------------------
    async def chat(self, req: ChatRequest) -> Choices:
        return await self._pipeline.chat(req)

    async def complete(self, req: CompletionRequest) -> Choices:
        return await self._pipeline.complete(req)

    async def embed(self, req: EmbeddingRequest) -> Embeddings:
        return await self._pipeline.embed(req)

    async def rerank(self, req: RerankRequest) -> Reranking:
        return await self._pipeline.rerank(req)

    async def transcribe(self, req: TranscriptionRequest) -> Transcription:
        return await self._pipeline.transcribe(req)

    async def count_tokens(self, req: ChatRequest) -> int:
        return await self._pipeline.count_tokens(req)

    async def check_images(self, req: ChatRequest) -> None:
        await self._pipeline.check_images(req)

    async def prompt_tokens(self, req: ChatRequest) -> list[int]:
        """The chat prompt's tokens on a local model (``req.model`` "" as :meth:`using` takes
        it): what :meth:`chat` would submit, shaped by ``add_generation_prompt`` and
        ``continue_final_message``."""
        model = req.model or self.implied_model(req.context.models)
        return await self._pipeline.prompt_tokens(replace(req, model=model))

    def resolve_local(self, name: str, scope: tuple[str, ...] | None = None) -> str:
        return self._pipeline.resolve_local(name or self.implied_model(scope), scope)

    def using(
        self, name: str, ctx: RequestContext | None = None
    ) -> contextlib.AbstractAsyncContextManager[LoadedModel]:
        """The loaded model ``name`` stands for (JIT), held for the ``async with`` block; no
        name: see :meth:`implied_model`."""
        ctx = ctx or RequestContext()
        return self._pipeline.using(name or self.implied_model(ctx.models), ctx)

    def implied_model(self, scope: tuple[str, ...] | None = None) -> str:
        """The model a local-model route (tokenize, detokenize, tokenizer_info) means when the
        request names none: "" where ``default_model`` is set (the gateway resolves it), else
        the only loaded model, else the only chat model in the library.

        Raises:
            InvalidRequest: none of these picks one model.
        """
        if self._pipeline.default_model:
            return ""
        statuses = self.models.all(scope)
        loaded = [s.model.id for s in statuses if s.state == "loaded"]
        if len(loaded) == 1:
            return loaded[0]
        chat = [s.model.id for s in statuses if "chat" in s.model.capabilities]
        if not loaded and len(chat) == 1:
            return chat[0]
        why = (
            f"{len(loaded)} models are loaded"
            if loaded
            else f"the library has {len(chat)} chat models"
        )
        raise InvalidRequest(
            f"'model' is required here: no default_model is set and {why}; name one",
            param="model",
        )

    async def close(self) -> None:
        await self.routing.close()
        if self.hub is not None:
            await self.hub.close()  # partial downloads stay on disk, resumable
        await self.models.close()
        self.cache.close()
        if self.responses is not None:
            self.responses.close()
        if self.shared is not None:
            await self.shared.close()


def assemble(
    library: ModelLibrary,
    runtimes: Mapping[str, Runtime],
    *,
    load_defaults: Callable[[], LoadOptions],
    jit_enabled: Callable[[], bool] = lambda: True,
    events: EventHub | None = None,
    presets: PresetStore | None = None,
    budget_bytes: Callable[[], int] | None = None,
    default_ttl: Callable[[], float | None] = lambda: None,
    auto_context_cap: Callable[[], int] = lambda: DEFAULT_MAX_AUTO_CONTEXT,
    calibration_file: Path | None = None,
    downloads: DownloadManager | None = None,
    foreign: ForeignLocations | None = None,
    aliases: AliasStore | None = None,
    routing: Callable[[], Routing] = Routing,
    providers: ProviderPool | None = None,
    groups: GroupStore | None = None,
    cache: Callable[[Embed], ResponseCache] | None = None,
    responses: ResponseStorage | None = None,
) -> Hearth:
    """The core wired once: the scheduler over ``runtimes``, the services, and the pipeline
    ``cache(gateway(dispatch(local | remote)))``. ``cache`` builds the response cache from the
    pipeline's own embed path (semantic mode); without it the cache is off. ``responses``
    keeps the Responses API's stored responses (None: nothing is kept)."""
    events = events or EventHub()
    policy = SchedulerPolicy(
        budget_bytes=budget_bytes,
        default_ttl=default_ttl,
        auto_context_cap=auto_context_cap,
        calibration_file=calibration_file,
    )
    scheduler = ModelScheduler(
        library, runtimes, events, load_defaults, presets=presets, policy=policy
    )
    models = ModelService(library, scheduler, events, presets, foreign)
    local = LocalRunner(models, scheduler, presets, jit_enabled)
    dispatch = Dispatch(library, models, local, providers)
    # the provider prefix first: an id neither local nor remote costs one library lookup, not two
    remote_or_local = lambda m: dispatch.is_remote(m) or library.has(m)  # noqa: E731
    is_loaded = lambda m: scheduler.state(m) == "loaded"  # noqa: E731
    router = None
    if providers is not None and groups is not None:
        router = GroupRouter(groups, providers, lambda name: _group_clash(name, library, gateway))
    gateway = Gateway(aliases, routing, remote_or_local, is_loaded, router)
    embed = routed_embed(gateway, dispatch)
    response_cache = cache(embed) if cache is not None else ResponseCache()
    pipeline = Pipeline(gateway, dispatch, response_cache, embed)
    return Hearth(
        pipeline,
        models,
        RoutingService(library, gateway, providers),
        events,
        downloads,
        response_cache,
        runtimes,
        responses,
    )


def _group_clash(name: str, library: ModelLibrary, gateway: Gateway) -> str | None:
    """What a group named ``name`` would shadow: a library model or an alias."""
    if library.has(name):
        return f"the library model '{name}'"
    if name in gateway.alias_map(name):
        return f"the alias '{name}'"
    return None
