"""The internal requests served by a remote engine (what the dispatcher does for a
``PREFIX/id`` target; it checks images first, with :func:`check_target_images`): each starts on the provider's client, its failures before
any output raised (a fallback chain moves on from the retryable ones).
Tested by tests/server/gateway/test_remote_bounds.py and
tests/e2e/providers/test_remote_providers.py."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from typing import TypeVar

from app.core.gateway.providers.base import RemoteModel, RemoteStream
from app.core.gateway.providers.pool import ProviderPool
from app.core.inference import fim, images
from app.core.inference import prompt as prompting
from app.core.inference import rerank as ranking
from app.core.inference.generation import Choices, Generation
from app.core.requests import (
    MAX_EMBED_INPUTS,
    ChatRequest,
    CompletionRequest,
    EmbeddingRequest,
    Embeddings,
    Ranked,
    Reranking,
    RerankRequest,
    Transcription,
    TranscriptionRequest,
)
from app.core.types import Delta, TranscriptSegment
from app.errors import (
    HearthError,
    InvalidRequest,
    NotSupported,
    ProviderError,
    UnsupportedParameter,
)

T = TypeVar("T")


async def _call(pool: ProviderPool, model_id: str, fn: Callable[[], Awaitable[T]]) -> T:
    """``fn()``, counted in flight on ``model_id`` while it runs, its outcome recorded on the
    provider's circuit (an unreachable one is probed now; its models leave the lists)."""
    pool.in_flight.add(model_id)
    try:
        result = await fn()
    except HearthError as e:
        pool.record(model_id, e)
        raise
    else:
        pool.record(model_id, None)
        return result
    finally:
        pool.in_flight.done(model_id)


async def _start(
    pool: ProviderPool, model_id: str, fn: Callable[[], Awaitable[RemoteStream]]
) -> RemoteStream:
    """A stream started by ``fn()``: in flight on ``model_id`` until it ends or is cancelled."""
    stream = await _call(pool, model_id, fn)
    pool.in_flight.add(model_id)
    return _Counted(stream, lambda: pool.in_flight.done(model_id))


class _Counted:
    """A started remote stream that calls ``done`` once, when it ends, fails or is cancelled."""

    def __init__(self, stream: RemoteStream, done: Callable[[], None]) -> None:
        self._stream = stream
        self._done: Callable[[], None] | None = done

    @property
    def prompt_tokens(self) -> int:
        return self._stream.prompt_tokens

    @prompt_tokens.setter
    def prompt_tokens(self, value: int) -> None:
        self._stream.prompt_tokens = value

    def _end(self) -> None:
        done, self._done = self._done, None
        if done is not None:
            done()

    def __aiter__(self) -> AsyncIterator[Delta]:
        return self._deltas()

    async def _deltas(self) -> AsyncIterator[Delta]:
        try:
            async for d in self._stream:
                yield d
        finally:
            self._end()

    def cancel(self) -> None:
        self._stream.cancel()
        self._end()


def check_images(req: ChatRequest, found: RemoteModel | None) -> None:
    """Images go on to a remote model unless its engine said it takes none (then a 400 naming
    the first image, as for a local model without a projector, before anything is sent)."""
    where = images.first_image(req)
    if where is not None and found is not None and found.refuses_images():
        raise UnsupportedParameter(
            f"{where}: an image needs a vision model; its engine says '{req.model}' takes no"
            " images",
            param=where,
        )


async def check_target_images(pool: ProviderPool, req: ChatRequest) -> None:
    """:func:`check_images` for ``req.model`` on its provider, as :func:`chat` would find it.

    Raises:
        UnsupportedParameter, ModelNotFound, ProviderUnavailable: as :func:`chat` before it sends.
    """
    check_images(req, (await pool.client_for(req.model))[2])


async def chat(pool: ProviderPool, req: ChatRequest) -> Choices:
    """``req``'s ``n`` choices, each its own upstream stream (choice ``i`` seeded ``seed+i``)."""
    client, remote_id, _ = await pool.client_for(req.model)
    gens: list[Generation] = []
    try:
        for i in range(req.n):
            one = replace(req, sampling=prompting.choice_sampling(req.sampling, i), n=1)
            stream = await _start(pool, req.model, functools.partial(client.chat, remote_id, one))
            gens.append(Generation(req.model, stream.prompt_tokens, stream))
    except BaseException:
        for g in gens:
            g.cancel()
        raise
    return Choices(gens)


async def complete(pool: ProviderPool, req: CompletionRequest) -> Choices:
    """Each prompt ``n`` times, one after the other (the first started here)."""
    client, remote_id, _ = await pool.client_for(req.model)
    count = len(req.prompts) * req.n

    async def start(k: int) -> Generation:
        one = replace(req, sampling=prompting.choice_sampling(req.sampling, k % req.n), n=1)
        prompt = req.prompts[k // req.n]
        stream = await _start(pool, req.model, lambda: client.complete(remote_id, one, prompt))
        indent = req.infill.indent if req.infill is not None else 0
        if req.max_predict_ms or indent:  # the editor's stops, as on a local model
            stops = fim.InfillStops(stream, max_predict_ms=req.max_predict_ms, indent=indent)
            return Generation(req.model, stream.prompt_tokens, stops)
        return Generation(req.model, stream.prompt_tokens, stream)

    return Choices([await start(0)], count, start)


async def embed(pool: ProviderPool, req: EmbeddingRequest) -> Embeddings:
    if len(req.inputs) > MAX_EMBED_INPUTS:
        raise InvalidRequest(f"at most {MAX_EMBED_INPUTS} inputs per request", param="input")
    client, remote_id, _ = await pool.client_for(req.model)
    vectors, tokens = await _call(pool, req.model, lambda: client.embed(remote_id, req))
    if req.dimensions is not None and vectors and req.dimensions != len(vectors[0]):
        raise InvalidRequest(
            f"this model's embeddings have {len(vectors[0])} dimensions and cannot be shortened",
            param="dimensions",
        )
    return Embeddings(vectors, tokens)


async def rerank(pool: ProviderPool, req: RerankRequest) -> Reranking:
    """The engine's own rerank where it has one; else the cosine of the model's embeddings
    (as a local embedder ranks), when the engine embeds with it."""
    ranking.check(req)
    client, remote_id, _ = await pool.client_for(req.model)
    try:
        ranked, tokens = await _call(pool, req.model, lambda: client.rerank(remote_id, req))
    except NotSupported as no_rerank:
        try:
            emb = await embed(pool, EmbeddingRequest(req.model, (req.query, *req.documents)))
        except ProviderError as e:
            if e.retryable:
                raise
            raise NotSupported(
                f"{no_rerank.message}, and '{req.model}' gives no embeddings to rank by",
                param="model",
            ) from e
        return ranking.by_cosine(emb.vectors[0], emb.vectors[1:], req.top_n, emb.prompt_tokens)
    results = [Ranked(i, s) for i, s in ranked]
    return Reranking(results[: req.top_n] if req.top_n is not None else results, tokens)


async def count_tokens(pool: ProviderPool, req: ChatRequest) -> int:
    """The prompt tokens as the engine renders and counts them (NotSupported where it has no
    endpoint for it)."""
    client, remote_id, _ = await pool.client_for(req.model)
    return await _call(pool, req.model, lambda: client.count_tokens(remote_id, req))


async def transcribe(pool: ProviderPool, req: TranscriptionRequest) -> Transcription:
    """The same audio on the provider's engine (its own multipart route), read back as
    segments (NotSupported where it has none)."""
    client, remote_id, _ = await pool.client_for(req.model)
    language, duration, segments = await _call(
        pool, req.model, lambda: client.transcribe(remote_id, req)
    )
    return Transcription(_Finished(language, duration, segments))


class _Finished:
    """A transcript the engine already finished (the ``Transcript`` protocol over a list)."""

    def __init__(self, language: str, duration: float, segments: list[TranscriptSegment]) -> None:
        self.language = language
        self.duration = duration
        self._segments = segments

    async def __aiter__(self) -> AsyncIterator[TranscriptSegment]:
        for s in self._segments:
            yield s

    def cancel(self) -> None:
        return None
