"""Dispatch: one target, local or remote. The gateway hands each target it tries to the
dispatcher, which sends a provider's ``PREFIX/id`` to that provider and any other id to the
models of this machine, after checking that the target takes the request's images.
Tested by tests/core/gateway/cache/test_response_cache.py and
tests/server/gateway/test_gateway.py."""

from __future__ import annotations

from app.core.engine.models import ModelService
from app.core.engine.runner import LocalRunner
from app.core.gateway.providers import serve as remote
from app.core.gateway.providers.pool import ProviderPool
from app.core.inference import images
from app.core.inference.generation import Choices
from app.core.library.index import ModelLibrary
from app.core.requests import (
    ChatRequest,
    CompletionRequest,
    EmbeddingRequest,
    Embeddings,
    Reranking,
    RerankRequest,
    Transcription,
    TranscriptionRequest,
)


class Dispatch:
    """Runs a request on the one target it names: a provider's model or a local one."""

    def __init__(
        self,
        library: ModelLibrary,
        models: ModelService,
        local: LocalRunner,
        providers: ProviderPool | None = None,
    ) -> None:
        self._library = library
        self._models = models
        self.local = local
        self._providers = providers

    def is_remote(self, model_id: str) -> bool:
        """A provider's ``PREFIX/id`` (a library id first: the gateway's order too)."""
        return (
            self._providers is not None
            and self._providers.is_target(model_id)
            and not self._library.has(model_id)
        )

    async def takes_images(self, req: ChatRequest) -> None:
        """The one vision check: UnsupportedParameter (naming the first image) when
        ``req.model`` takes no images; nothing for a request without images."""
        if images.first_image(req) is None:
            return
        if self._providers is not None and self.is_remote(req.model):
            await remote.check_target_images(self._providers, req)
        else:
            images.check_vision(req, lambda m: self._models.get(m, req.context.models))

    async def _checked(self, req: ChatRequest) -> None:
        if req.context.vision_checked != req.model:  # the edge checked the first target
            await self.takes_images(req)

    async def chat(self, req: ChatRequest) -> Choices:
        await self._checked(req)
        if self._providers is not None and self.is_remote(req.model):
            return await remote.chat(self._providers, req)
        return await self.local.chat(req)

    async def count_tokens(self, req: ChatRequest) -> int:
        await self._checked(req)
        if self._providers is not None and self.is_remote(req.model):
            return await remote.count_tokens(self._providers, req)
        return await self.local.count_tokens(req)

    async def complete(self, req: CompletionRequest) -> Choices:
        if self._providers is not None and self.is_remote(req.model):
            return await remote.complete(self._providers, req)
        return await self.local.complete(req)

    async def embed(self, req: EmbeddingRequest) -> Embeddings:
        if self._providers is not None and self.is_remote(req.model):
            return await remote.embed(self._providers, req)
        return await self.local.embed(req)

    async def rerank(self, req: RerankRequest) -> Reranking:
        if self._providers is not None and self.is_remote(req.model):
            return await remote.rerank(self._providers, req)
        return await self.local.rerank(req)

    async def transcribe(self, req: TranscriptionRequest) -> Transcription:
        if self._providers is not None and self.is_remote(req.model):
            return await remote.transcribe(self._providers, req)
        return await self.local.transcribe(req)
