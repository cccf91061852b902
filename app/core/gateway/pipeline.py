"""The request pipeline, composed once: ``cache(gateway(dispatch(local | remote)))``.

A request first pays what it can cost against its key's rate limits (the charger on its
context); then the response cache answers it or lets it through; the gateway tries each target
its model names (aliases, fallback chains, ``auto``, the default model, within the caller's
scope) until one starts; the dispatcher runs each try on a provider or on this machine. Every
stage reads what it needs from the request and its :class:`~app.core.requests.RequestContext`.
Tested by tests/core/gateway/cache/test_response_cache.py and tests/server/gateway/test_gateway.py.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace

from app.core.gateway import ratelimit
from app.core.gateway.auto import RequestFacts
from app.core.gateway.cache.replay import ResponseCache
from app.core.gateway.dispatch import Dispatch
from app.core.gateway.facts import chat_facts, completion_facts, embed_facts
from app.core.gateway.resolve import Gateway
from app.core.inference import images
from app.core.inference import rerank as ranking
from app.core.inference.generation import Choices
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
from app.core.types import LoadedModel
from app.errors import NotSupported

Embed = Callable[[EmbeddingRequest], Awaitable[Embeddings]]


def routed_embed(gateway: Gateway, dispatch: Dispatch) -> Embed:
    """Embedding through the gateway, uncharged: the pipeline's embed stage, and the response
    cache's own lookups in semantic mode (built before the cache, which needs it)."""

    async def embed(req: EmbeddingRequest) -> Embeddings:
        result, route = await gateway.run(
            req.model,
            embed_facts(req),
            req.context,
            lambda m: dispatch.embed(replace(req, model=m)),
        )
        return replace(result, model=route[-1], route=tuple(route))

    return embed


class Pipeline:
    """Every inference request's way through the core, whichever edge it came from."""

    def __init__(
        self, gateway: Gateway, dispatch: Dispatch, cache: ResponseCache, embed: Embed
    ) -> None:
        self._gateway = gateway
        self._dispatch = dispatch
        self._cache = cache
        self._embed = embed

    async def chat(self, req: ChatRequest) -> Choices:
        """Start a chat request on the first target its model resolves to that starts. The
        Choices say which model answered and the ids tried (``model``, ``route``)."""
        await ratelimit.charge(req)  # what it can cost, before any work (the edge settles it after)
        return await self._cache.serve(req, chat_facts(req), self._gateway, self._dispatch.chat)

    async def complete(self, req: CompletionRequest) -> Choices:
        """Start a completion request on the first target that starts (see :meth:`chat`)."""
        await ratelimit.charge(req)
        return await self._cache.serve(
            req, completion_facts(req), self._gateway, self._dispatch.complete
        )

    async def embed(self, req: EmbeddingRequest) -> Embeddings:
        """Embed each input on the first target that starts."""
        await ratelimit.charge(req)
        return await self._embed(req)

    async def rerank(self, req: RerankRequest) -> Reranking:
        """Score each document against the query, best first (``top_n`` of them).

        Raises:
            InvalidRequest: no documents or more than 200, an empty query or document, a model
                that does not rerank; ContextLengthExceeded: a query and document over the
                context; NotSupported: a remote engine with neither rerank nor embeddings.
        """
        ranking.check(req)
        await ratelimit.charge(req)
        result, _ = await self._gateway.run(
            req.model,
            RequestFacts(),
            req.context,
            lambda m: self._dispatch.rerank(replace(req, model=m)),
        )
        return result

    async def transcribe(self, req: TranscriptionRequest) -> Transcription:
        """Start turning the request's audio into text on the first target that starts (the
        audio decoded and the language known); its segments come as they are decoded.

        Raises:
            InvalidRequest: a model that does not transcribe (param ``model``), audio that
                cannot be read or is over its bounds (param ``file``).
        """
        await ratelimit.charge(req)
        result, route = await self._gateway.run(
            req.model,
            RequestFacts(),
            req.context,
            lambda m: self._dispatch.transcribe(replace(req, model=m)),
        )
        return replace(result, model=route[-1], route=tuple(route))

    async def count_tokens(self, req: ChatRequest) -> int:
        """The prompt tokens :meth:`chat` would submit for ``req`` (the same resolution, tool
        planning, template and tokenizer), without generating.

        Raises:
            ModelNotFound, TemplateError, InvalidRequest (as :meth:`chat`); NotSupported: the
            engine without an endpoint to count with.
        """
        count, _ = await self._gateway.run(
            req.model,
            chat_facts(req),
            req.context,
            lambda m: self._dispatch.count_tokens(replace(req, model=m)),
        )
        return count

    async def check_images(self, req: ChatRequest) -> None:
        """Before any image is fetched or decoded: the target ``req.model`` resolves to (as
        :meth:`chat` resolves it) must take images. The target that passed is noted on the
        request's context, so the dispatcher does not check it again."""
        if images.first_image(req) is None:
            return
        target = await self._gateway.check(
            req.model,
            chat_facts(req),
            req.context,
            lambda t: self._dispatch.takes_images(replace(req, model=t)),
        )
        req.context.vision_checked = target

    @property
    def default_model(self) -> str:
        """The routing setting a request naming no model goes to ("" when none is set)."""
        return self._gateway.default_model

    async def prompt_tokens(self, req: ChatRequest) -> list[int]:
        """The prompt tokens :meth:`chat` would submit for ``req`` on the local model its name
        stands for (see :meth:`resolve_local`; a remote model is NotSupported)."""
        local = self.resolve_local(req.model, req.context.models)
        return await self._dispatch.local.prompt_tokens(replace(req, model=local))

    def resolve_local(self, name: str, scope: tuple[str, ...] | None = None) -> str:
        """The local model id ``name`` stands for: itself, or an alias's (or ``auto``'s) first
        local target. Raises ModelNotFound, or NotSupported for a remote model."""
        targets = self._gateway.targets(name, RequestFacts(), scope)
        for t in targets:
            if not self._dispatch.is_remote(t):
                return t
        if targets == [name]:
            raise NotSupported(
                f"'{name}' is served by a remote engine; this route works on local models",
                param="model",
            )
        raise NotSupported(
            f"'{name}' stands for remote models only; this route works on local models",
            param="model",
        )

    @contextlib.asynccontextmanager
    async def using(
        self, name: str, ctx: RequestContext | None = None
    ) -> AsyncIterator[LoadedModel]:
        """The loaded model ``name`` stands for (JIT), held for the ``async with`` block
        (tokenize, detokenize...); an alias stands for its first local target."""
        ctx = ctx or RequestContext()
        async with self._dispatch.local.using(self.resolve_local(name, ctx.models), ctx) as lm:
            yield lm
