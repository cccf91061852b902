"""THE internal requests. Every wire API (OpenAI chat and completions, Responses, Anthropic
Messages, Ollama) is translated into one of these by its protocol adapter, and every runtime
(in process, or a remote engine) serves them through :class:`app.core.service.Hearth`.

No wire names here: ``max_tokens`` is the generation bound whatever the protocol calls it
(``max_output_tokens``, ``num_predict``), ``ttl`` is how long the model stays loaded after the
request (``keep_alive``), a constraint is a :class:`~app.core.types.Constraint`.
Tested by tests/core/gateway/test_gateway.py and tests/core/gateway/cache/test_replay.py.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from app.core.types import (
    UNSET,
    ChatMessage,
    Constraint,
    SamplingParams,
    SpeechJob,
    Tool,
    Transcript,
)

MAX_EMBED_INPUTS = 2048  # inputs in one embedding request, every protocol
MAX_RERANK_DOCUMENTS = 200  # documents in one rerank request, every protocol

ToolMode = Literal["auto", "none", "required", "named"]


@dataclass(slots=True)
class RequestContext:
    """Who a request runs for, and what is measured of it: it travels on the request through
    every stage (cache, gateway, dispatch, the engine), never in a context variable.

    The server's edge fills the caller's part; a request made in process (the GUI, the CLI)
    gets an empty one: every model allowed, nothing charged, traced or shared.

    Attributes:
        models: the key's model patterns (fnmatch); None: every model.
        partition: the response-cache partition of the key ("" without a key).
        cache: the client's cache directive (``force``, ``bypass``, ``no-store``) or None.
        charge: the key's rate limits, charged a request's estimated cost before any work.
        trace: the server's tracing of this request (``gateway.telemetry.Scope``), or None.
        load_ms: filled by the engine: the time spent waiting for the model (None: no wait).
        load_started_ns: when that wait began (``time.time_ns()``), for a span's start.
        vision_checked: the target whose vision was checked before its images were decoded
            (the gateway's first); the dispatcher checks any other target it tries.
        session: the affinity key a replica group keeps on one replica (the ``x-session-id``
            header, else the body's user); "" when none.
        user: the body's end-user id (OpenAI ``user``, Anthropic ``metadata.user_id``), sent
            on to remote engines with ``x-user-id``; "" when none.
        session_header: the ``x-session-id`` (or ``x-hearth-session``) the client sent, sent on.
    """

    models: tuple[str, ...] | None = None
    partition: str = ""
    cache: str | None = None
    charge: Callable[[Any], Awaitable[None] | None] | None = None  # awaited when it returns one
    trace: Any = None
    load_ms: float | None = None
    load_started_ns: int | None = None
    vision_checked: str | None = None
    session: str = ""
    user: str = ""
    session_header: str = ""


def _context() -> RequestContext:
    return RequestContext()


def _ctx_field() -> Any:
    """The request's context: not part of what it asks (equality, the cache key, repr)."""
    return field(default_factory=_context, compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class ToolChoice:
    """How the model may use the tools: ``auto`` (it decides), ``none``, ``required`` (at least
    one call), or ``named`` (exactly one call of ``name``). ``parallel``: several calls in one
    answer are allowed (a named choice is always one call)."""

    mode: ToolMode = "auto"
    name: str | None = None
    parallel: bool = True

    @property
    def choice(self) -> str:
        """ "none" | "auto" | "required" | the tool's name (the service's planner reads this)."""
        return self.name if self.mode == "named" and self.name else self.mode


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """A chat generation (``n`` choices of one conversation)."""

    model: str
    messages: tuple[ChatMessage, ...]
    sampling: SamplingParams = SamplingParams()
    max_tokens: int | None = None  # None: until the context is full
    stop: tuple[str, ...] = ()
    tools: tuple[Tool, ...] = ()
    tool_choice: ToolChoice = ToolChoice()
    constraint: Constraint | None = None
    logprobs: int | None = None  # None = off; N = each token's and the N most likely
    template_vars: dict[str, Any] = field(default_factory=dict)
    ttl: Any = UNSET  # seconds the model stays loaded after this; None = forever; UNSET = default
    n: int = 1
    request_id: str = ""
    context: RequestContext = _ctx_field()
    prompt_logprobs: int | None = None  # None = off; N = each prompt token's and N most likely
    # how the template closes the prompt: the assistant's turn opened (the default), or the
    # last message left open for the model to continue (vLLM's continue_final_message)
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    priority: int = 0  # lower is served first (vLLM's priority); the answer is the same


@dataclass(frozen=True, slots=True)
class Infill:
    """Fill-in-the-middle: the completion's prompt is the text before the cursor, this is the
    rest (built into the model's FIM tokens by app/core/inference/fim).

    Attributes:
        suffix: the text after the cursor.
        extra: other files as context, ``(filename, text)`` pairs (llama-server's input_extra).
        cursor: text put after the prefix, past any cut (llama-server's ``prompt``: what the
            cursor's line already holds).
        indent: stop at a new line indented less than this (llama-server's n_indent; 0: off).
        param: the wire field that asked for it, named by a refusal (``suffix``, ``input_suffix``).
    """

    suffix: str
    extra: tuple[tuple[str, str], ...] = ()
    cursor: str = ""
    indent: int = 0
    param: str = "suffix"


@dataclass(frozen=True, slots=True)
class CompletionRequest:
    """Raw completions: each prompt (text, or token ids) ``n`` times, in order."""

    model: str
    prompts: tuple[str | tuple[int, ...], ...]
    sampling: SamplingParams = SamplingParams()
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    constraint: Constraint | None = None
    logprobs: int | None = None
    ttl: Any = UNSET
    n: int = 1
    request_id: str = ""
    context: RequestContext = _ctx_field()
    echo: bool = False  # the prompt precedes the answer (with its logprobs when asked)
    prompt_logprobs: int | None = None  # None = off; N = each prompt token's and N most likely
    infill: Infill | None = None  # fill-in-the-middle: each prompt is the text before the cursor
    max_prompt_ms: float | None = None  # llama-server's t_max_prompt_ms
    max_predict_ms: float | None = None  # llama-server's t_max_predict_ms
    priority: int = 0  # lower is served first (vLLM's priority); the answer is the same


@dataclass(frozen=True, slots=True)
class EmbeddingRequest:
    """Embed each input (text, or token ids); ``dimensions``: the size the caller expects."""

    model: str
    inputs: tuple[str | tuple[int, ...], ...]
    ttl: Any = UNSET
    dimensions: int | None = None
    context: RequestContext = _ctx_field()


@dataclass(frozen=True, slots=True)
class RerankRequest:
    """Score ``documents`` against ``query`` (served by engines that rerank)."""

    model: str
    query: str
    documents: tuple[str, ...]
    top_n: int | None = None
    ttl: Any = UNSET
    context: RequestContext = _ctx_field()


@dataclass(frozen=True, slots=True)
class Ranked:
    """One document's place in a rerank answer: its index in the request and its score."""

    index: int
    score: float


@dataclass(frozen=True, slots=True)
class Reranking:
    """What :meth:`Hearth.rerank` returns: the documents best first (``top_n`` of them), and
    the tokens the scoring took."""

    results: list[Ranked]
    prompt_tokens: int


@dataclass(frozen=True, slots=True)
class Embeddings:
    """What :meth:`Hearth.embed` returns: one vector per input, and the tokens they took."""

    vectors: list[list[float]]
    prompt_tokens: int
    model: str = ""  # the model that answered (the gateway's last target tried)
    route: tuple[str, ...] = ()  # the ids tried, in order


@dataclass(frozen=True, slots=True)
class TranscriptionRequest:
    """Speech to text: the audio and how to read it (``job``), on a speech model."""

    model: str
    job: SpeechJob
    ttl: Any = UNSET
    context: RequestContext = _ctx_field()


@dataclass(frozen=True, slots=True)
class Transcription:
    """What :meth:`Hearth.transcribe` returns: the transcript under way, the model that
    answered and the ids tried."""

    transcript: Transcript
    model: str = ""
    route: tuple[str, ...] = ()
