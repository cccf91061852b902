"""What the core knows of a remote engine: the client a runtime implements for it (probe,
chat, complete, embed, rerank, tokenize), and what a probe found.
Tested by tests/core/gateway/providers/test_pool.py and tests/runtimes/remote/test_kinds.py."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from app.core.requests import (
    ChatRequest,
    CompletionRequest,
    EmbeddingRequest,
    RerankRequest,
    TranscriptionRequest,
)
from app.core.types import GenerationStream, TranscriptSegment

STATES = ("ready", "starting", "unreachable", "unauthorized", "error")


@dataclass(frozen=True, slots=True)
class RemoteModel:
    """A model an engine serves: its own id (case kept), its context length where the engine
    tells it, and what it serves (chat and completion unless the engine says otherwise).
    ``stated``: the engine said what this model takes (a Hearth's or Ollama's capabilities,
    llama.cpp's modalities), so a capability missing from the list is a "no"; otherwise the
    list is a default and whether it takes images is the engine's to say on the request."""

    id: str
    context_length: int | None = None
    capabilities: tuple[str, ...] = ("completion", "chat")
    stated: bool = False

    def refuses_images(self) -> bool:
        """True when the engine said this model takes no images."""
        return self.stated and "vision" not in self.capabilities


class Answer(NamedTuple):
    """One probe request's answer: the HTTP status (0: no answer, ``body`` says why) and the
    body (parsed JSON, or the text when it is not JSON)."""

    status: int
    body: Any = None


@dataclass(frozen=True, slots=True)
class Probe:
    """What probing an engine found. ``kind``: what its answers say it is (detection)."""

    state: str  # one of STATES
    models: tuple[RemoteModel, ...] = ()
    latency_ms: float | None = None
    error: str | None = None
    kind: str | None = None
    answers: dict[str, Answer] = field(default_factory=dict, compare=False)


class RemoteStream(GenerationStream, Protocol):
    """A started remote generation (its first event already received): deltas, cancel, and the
    prompt tokens when the engine said them up front (else 0 until the final usage)."""

    prompt_tokens: int


class RemoteClient(Protocol):
    """One provider's engine, as a runtime reaches it. Every method raises a HearthError
    (ProviderUnavailable, ProviderError: with ``retryable`` set for what a fallback may try
    elsewhere) before any output; a stream that fails later ends with an error delta."""

    async def probe(self, *, detect: bool = False) -> Probe:
        """Health and models (and the kind from the engine's answers, when ``detect``);
        never raises: a failure is the probe's state."""
        ...

    async def check(self, path: str, timeout: float) -> Answer:
        """One health check: GET ``path`` under the URL's host within ``timeout`` seconds;
        never raises (status 0: no answer, the body says why)."""
        ...

    async def chat(self, remote_id: str, req: ChatRequest) -> RemoteStream:
        """Start one generation of ``req`` (its ``n`` is the caller's: one call per choice)."""
        ...

    async def complete(
        self, remote_id: str, req: CompletionRequest, prompt: str | tuple[int, ...]
    ) -> RemoteStream: ...

    async def embed(self, remote_id: str, req: EmbeddingRequest) -> tuple[list[list[float]], int]:
        """(one vector per input, prompt tokens)."""
        ...

    async def rerank(
        self, remote_id: str, req: RerankRequest
    ) -> tuple[list[tuple[int, float]], int]:
        """((index, score) best first, prompt tokens). NotSupported where the engine has none."""
        ...

    async def count_tokens(self, remote_id: str, req: ChatRequest) -> int:
        """The prompt tokens of ``req`` as the engine renders and tokenizes it (its template
        and tokenizer). NotSupported where the engine has no endpoint for it."""
        ...

    async def transcribe(
        self, remote_id: str, req: TranscriptionRequest
    ) -> tuple[str, float, list[TranscriptSegment]]:
        """(language, duration, segments) of the request's audio, on the engine's
        speech-to-text route. NotSupported where the engine has none."""
        ...

    async def close(self) -> None: ...

    async def close_when_idle(self) -> None:
        """Close once the streams running on this client have ended."""
        ...
