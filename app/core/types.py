"""Frozen value types shared by every layer, and the protocols runtimes implement.
Tested by tests/core/engine/test_scheduler.py and tests/runtimes/test_worker.py."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple, Protocol, runtime_checkable

ModelFormat = Literal["gguf", "mlx", "whisper"]
FinishReason = Literal["stop", "length", "tool_calls", "cancelled", "error"]


@dataclass(frozen=True, slots=True)
class LocalModel:
    """A model in the library.

    Attributes:
        id: stable lowercase id, ``[a-z0-9._:/-]+``.
        path: the GGUF file or MLX folder.
        owned: True when Hearth put the file in its models folder (and may delete it).
    """

    id: str
    path: str
    format: ModelFormat
    size_bytes: int
    owned: bool
    architecture: str | None = None
    name: str | None = None
    parameters: int | None = None
    quantization: str | None = None
    context_length: int | None = None
    has_chat_template: bool = False
    chat_template: str | None = None
    origin: str = "imported"
    added_at: float = 0.0
    mtime: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @property
    def capabilities(self) -> tuple[str, ...]:
        """What the model serves, as every listing names it: a cross-encoder reranks; an
        embedder embeds and reranks (by cosine); a Whisper model transcribes and translates
        speech; any other model completes and chats, and fills in the middle (``fim``) when
        its vocabulary has the markers."""
        if self.format == "whisper":
            return ("transcription", "translation")
        if self.extra.get("reranker"):
            return ("rerank",)
        if self.extra.get("embedding"):
            return ("embeddings", "rerank")
        caps = ("completion", "chat", "vision") if supports_vision(self) else ("completion", "chat")
        return (*caps, "fim") if self.extra.get("fim") else caps

    def summary(self) -> dict[str, Any]:
        """The public JSON shape (``hearth ls --json``)."""
        return {
            "id": self.id,
            "format": self.format,
            "architecture": self.architecture,
            "parameters": self.parameters,
            "quantization": self.quantization,
            "size_bytes": self.size_bytes,
            "context_length": self.context_length,
            "has_chat_template": self.has_chat_template,
            "path": self.path,
            "owned": self.owned,
            "origin": self.origin,
            "projector": self.projector_summary(),
            "capabilities": list(self.capabilities),
        }

    def projector_summary(self) -> dict[str, Any] | None:
        """The paired vision projector, ``{"path": ..., "size": ...}``, or None."""
        if not supports_vision(self):
            return None
        path = str(self.extra["projector"])
        try:
            size: int | None = os.stat(path).st_size
        except OSError:  # gone since it was paired: the load says so
            size = None
        return {"path": path, "size": size}


@dataclass(frozen=True, slots=True)
class LoadOptions:
    """How to load a model. 0 / None means "let Hearth decide"."""

    context_length: int = 0
    threads: int = 0
    batch_size: int = 512
    ubatch_size: int = 0  # 0 = batch_size
    gpu_layers: int = -1  # -1 = auto (all that fit), 0 = none
    use_mmap: bool = True
    use_mlock: bool = False
    flash_attention: str = "auto"  # auto | on | off
    kv_type: str = "f16"  # f16 | q8_0 | q4_0
    rope_scaling: str = "none"  # none | linear | yarn ("none" = the model's own)
    rope_freq_base: float = 0.0  # 0 = the model's
    rope_freq_scale: float = 0.0  # 0 = the model's
    seed: int | None = None
    # requests decoded together in one batch (llama.cpp). With prompt_cache "reuse" or "off"
    # they share one KV cache of context_length tokens (the most one request may use); with
    # "exact" each gets its own context_length of cache (memory grows with this number). In a
    # shared cache on the CPU, requests beyond 4 join only while that is faster
    parallel: int = 8
    # reuse: a prompt continues from the longest common prefix any kept cache holds (prompt
    # and generated answer; several conversations kept); exact: only whole aligned micro-
    # batches of an earlier prompt are reused, so answers and logprobs are bit-identical to an
    # uncached solo run; off: nothing is kept
    prompt_cache: str = "reuse"
    # shared: the sequences share one cache of context_length cells (llama-server's default);
    # per-sequence: each of the `parallel` requests gets its own cache of context_length cells
    # (llama-server's explicit -np N): memory grows with `parallel`, but a step's attention
    # reads only the sequence's own cells, so batched decoding of many streams is faster
    kv_layout: str = "shared"
    # ngram: a request decoding alone drafts the tokens that followed its last few tokens
    # earlier in its prompt or answer and checks them in one batch (speculative decoding by
    # prompt lookup; the same answers but at near ties), and stops once its drafts are not
    # kept; off (the default: prose came out slower with it on an AMD EPYC): one token a step
    speculative: str = "off"


@dataclass(frozen=True, slots=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repeat_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias added to its logit)
    # llama.cpp's infill sampler after min-p (llama-server's "infill" in samplers): it ends a
    # fill-in-the-middle answer when the end is likely enough (llama.cpp runtime only)
    infill: bool = False


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A whole tool call: its id, the function's name and its arguments as JSON text."""

    id: str
    name: str
    arguments: str = "{}"


class Constraint(NamedTuple):
    """What the output must be: ``json_object`` (any JSON object), ``json_schema`` (``value`` is
    the schema as JSON text) or ``tool_call`` (forced calls: ``value`` is the call object's
    spec as JSON, built by the service). A tuple, so a runtime may unpack ``kind, value``."""

    kind: str
    value: str = ""


@dataclass(frozen=True, slots=True)
class ChatMessage:
    role: str
    content: str
    name: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    # decoded images; ``content`` holds IMAGE_MARKER once per image, in order (app/core/inference/images.py)
    images: tuple[ImageInput, ...] = ()
    # images as the wire sent them, before the server fetches and decodes them into ``images``
    image_sources: tuple[ImageSource, ...] = ()


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """One generation: a tokenized prompt and how to continue it."""

    prompt_tokens: tuple[int, ...]
    max_tokens: int | None
    sampling: SamplingParams = SamplingParams()
    stop: tuple[str, ...] = ()
    request_id: str = ""
    logprobs: int | None = None  # None = off; N = the sampled token plus the N most likely
    constraint: Constraint | None = None
    prepare_ms: float = 0.0  # spent rendering and tokenizing it (reported in its timings)
    # the prompt's images in order; each takes a run of negative pseudo-token ids (derived from
    # its digest) in prompt_tokens, where its embeddings go (app/runtimes/llama/vision.py)
    images: tuple[ImageInput, ...] = ()
    priority: int = 0  # lower is served first (vLLM's priority)
    # stop reading the prompt after this long (llama-server's t_max_prompt_ms)
    max_prompt_ms: float | None = None
    # stop once this long after the first token, at a newline (t_max_predict_ms)
    max_predict_ms: float | None = None


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """One generated token's log-probability, with the most likely alternatives."""

    token: str
    logprob: float
    bytes: tuple[int, ...]
    top: tuple[tuple[str, float, tuple[int, ...]], ...] = ()


@dataclass(frozen=True, slots=True)
class PromptToken:
    """One prompt token as the model scored it (echo, prompt_logprobs).

    Attributes:
        logprob: its log-probability after the tokens before it; None for the first token.
        rank: 1 for the most likely token at its place, and so on; None for the first.
        top: the most likely tokens at its place, best first: (token id, log-probability).
        text, top_text: their pieces as the vocabulary spells them (filled by the service).
    """

    id: int
    logprob: float | None
    rank: int | None
    top: tuple[tuple[int, float], ...] = ()
    text: str = ""
    top_text: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ScoredPrompt:
    """A prompt's tokens scored, and how many of them the engine decoded to do it (the rest
    came from its cache: a prefix shared with a prompt scored before), in how many decodes
    (one that read several prompts of a list together counts for each of them)."""

    tokens: tuple[PromptToken, ...]
    decoded: int
    decodes: int = 0


@runtime_checkable
class PromptScorer(Protocol):
    """A loaded model that gives every prompt token's log-probability (llama.cpp)."""

    async def score_prompts(self, prompts: list[list[int]], top: int) -> list[ScoredPrompt]:
        """Each prompt's tokens with their log-probabilities and the ``top`` most likely
        tokens at each place (0-20)."""
        ...


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    reasoning_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True, slots=True)
class Timings:
    prompt_n: int = 0
    prompt_ms: float = 0.0
    predicted_n: int = 0
    predicted_ms: float = 0.0
    cache_n: int = 0  # prompt tokens the prompt cache already held (not processed again)
    prepare_ms: float = 0.0  # template rendering and tokenization, before the queue
    queue_ms: float = 0.0  # waiting for a free sequence of the model
    batch_size: float = 0.0  # sequences decoded together per step, on average
    threads: int = 0  # decode threads at the end (0: not a local llama.cpp model)
    cpu_busy: bool = False  # fewer threads than the cores: other programs keep the CPU busy
    draft_n: int = 0  # speculative decoding: tokens drafted (llama-server's names)
    draft_n_accepted: int = 0  # of them, those the sampler picked

    @property
    def predicted_per_second(self) -> float:
        return self.predicted_n / (self.predicted_ms / 1000.0) if self.predicted_ms > 0 else 0.0

    @property
    def prompt_per_second(self) -> float:
        return self.prompt_n / (self.prompt_ms / 1000.0) if self.prompt_ms > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "prompt_n": self.prompt_n,
            "prompt_ms": round(self.prompt_ms, 3),
            "prompt_per_second": round(self.prompt_per_second, 3),
            "predicted_n": self.predicted_n,
            "predicted_ms": round(self.predicted_ms, 3),
            "predicted_per_second": round(self.predicted_per_second, 3),
            "cache_n": self.cache_n,
            "prepare_ms": round(self.prepare_ms, 3),
            "queue_ms": round(self.queue_ms, 3),
            "batch_size": round(self.batch_size, 2),
            "threads": self.threads,
            "cpu_busy": self.cpu_busy,
            "draft_n": self.draft_n,
            "draft_n_accepted": self.draft_n_accepted,
        }


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    """A streamed tool call: the first delta of an index has id and name, later ones arguments."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


@dataclass(frozen=True, slots=True)
class ToolParseIssue:
    """A tool call the model started but did not finish correctly: its text is returned as
    content instead. ``reason``: ``incomplete`` (its block or the output ended first),
    ``malformed_arguments`` or ``unknown_tool`` (a tool the request did not offer); ``index``:
    the call's index when its deltas were streamed already (a whole answer leaves that call out).
    """

    reason: str
    index: int | None = None


@dataclass(frozen=True, slots=True)
class Delta:
    """A piece of a generation as the runtime produces it.

    ``text`` is already valid UTF-8 (a runtime holds back partial characters). The final delta has
    ``finish_reason`` set and carries ``usage`` and ``timings``.
    """

    text: str = ""
    token_count: int = 0
    finish_reason: FinishReason | None = None
    usage: Usage | None = None
    timings: Timings | None = None
    error: str | None = None
    logprobs: tuple[TokenLogprob, ...] = ()
    reasoning: str = ""  # text inside the model's think block (chat only)
    stop_string: str | None = None  # on the final delta: the stop string that ended it, if any
    tool_calls: tuple[ToolCallDelta, ...] = ()
    # on a final "cancelled" delta: "model_unloaded" when the model went away under it
    error_code: str | None = None
    # decoding with fewer threads than the cores because other programs keep the CPU busy
    cpu_busy: bool = False
    # on a first delta: the prompt's tokens scored (echo, prompt_logprobs)
    prompt: tuple[PromptToken, ...] = ()
    # on the final delta: a started tool call that was returned as text, and why
    tool_parse: ToolParseIssue | None = None


class GenerationStream(Protocol):
    """A cancellable async stream of deltas for one submitted request."""

    def __aiter__(self) -> AsyncIterator[Delta]: ...

    def cancel(self) -> None: ...


@runtime_checkable
class LoadedModel(Protocol):
    """A model resident in memory, owned by a worker thread of its runtime."""

    model_id: str
    context_length: int

    @property
    def chat_template(self) -> str | None: ...

    @property
    def special_tokens(self) -> dict[str, Any]:
        """bos, eos (text), bos_id, eos_id, n_vocab; where the runtime knows them also pad,
        unk (text) and pad_id, unk_id, add_bos, add_eos, tokenizer_model."""
        ...

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]: ...

    def detokenize(self, tokens: list[int]) -> str: ...

    def token_pieces(self, tokens: list[int]) -> list[str]:
        """Each token's text as the vocabulary spells it (special tokens included)."""
        ...

    @property
    def max_token_bytes(self) -> int:
        """The longest token's length in UTF-8 bytes: a text longer than ``context_length``
        times this cannot fit the context, which the service checks before tokenizing."""
        ...

    @property
    def capabilities(self) -> frozenset[str]:
        """``{"completion", "chat"}`` for generative models, ``{"embeddings", "rerank"}`` for
        embedders, ``{"rerank"}`` for cross-encoders (rank pooling)."""
        ...

    def submit(self, request: GenerationRequest) -> GenerationStream:
        """Queue ``request``; raises QueueFull when the bounded queue is full. Its constraint
        must have passed :meth:`check_constraint` (else it fails when its turn comes)."""
        ...

    async def check_constraint(self, constraint: Constraint) -> None:
        """Compile an output constraint off the event loop (remembered once it compiles).

        Raises:
            InvalidRequest: it cannot be enforced (a 400 before any output).
        """
        ...

    async def embed(self, inputs: list[list[int]]) -> list[list[float]]:
        """One normalized vector per tokenized input (embedding models only)."""
        ...

    async def rank(self, query: list[int], documents: list[list[int]]) -> tuple[list[float], int]:
        """One relevance score per document for the query, and the tokens scored
        (cross-encoders only; the tokens carry no special tokens: the runtime frames each
        pair as the model expects)."""
        ...

    @property
    def pending(self) -> int: ...

    def close(self) -> None: ...


class Runtime(Protocol):
    """A plug-in that loads models of some formats in process."""

    name: str
    formats: Sequence[ModelFormat]

    def available(self) -> bool: ...

    def load(self, model: LocalModel, options: LoadOptions) -> LoadedModel:
        """Load ``model`` (blocking; the scheduler runs this off the event loop)."""
        ...


@dataclass(frozen=True, slots=True)
class ModelStatus:
    """A library model with its load state, as listings show it."""

    model: LocalModel
    state: str  # loaded | loading | not-loaded
    context_length: int | None  # allocated context when loaded
    runtime: str | None
    memory_bytes: int | None = None

    def as_dict(self) -> dict[str, Any]:
        d = self.model.summary()
        d.update(
            state=self.state,
            loaded_context_length=self.context_length,
            runtime=self.runtime,
            memory_bytes=self.memory_bytes,
            capabilities=list(self.model.capabilities),
        )
        return d


# a keyword argument the caller did not pass (None means "forever" where a ttl is asked)
UNSET: Any = object()


@dataclass(frozen=True, slots=True)
class ImageInput:
    """One decoded image, as a runtime gets it.

    Attributes:
        rgb: decoded pixels, RGB8, row-major, ``width * height * 3`` bytes.
        digest: sha256 hex of (width, height, rgb): the prompt cache keys on it.
        where: the wire parameter it came from (``messages[0].content[1]``), for errors.
    """

    rgb: bytes
    width: int
    height: int
    digest: str
    where: str = ""


@dataclass(frozen=True, slots=True)
class ImageSource:
    """An image as the wire gave it, before fetching and decoding: ``data`` (encoded bytes) or
    ``url`` (http/https), and the media type the client declared, if any."""

    where: str
    data: bytes | None = None
    url: str | None = None
    media_type: str | None = None
    media_param: str | None = None  # the parameter that declared media_type


@dataclass(frozen=True, slots=True)
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]

    def as_openai(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }


def supports_vision(model: LocalModel) -> bool:
    """A GGUF model with a paired projector (``extra["projector"]``: an mmproj GGUF's path),
    or an MLX folder whose config describes a vision model (``extra["vision"]``, mlx-vlm)."""
    if model.format == "mlx":
        return model.extra.get("vision") is True
    projector = model.extra.get("projector")
    return model.format == "gguf" and isinstance(projector, str) and bool(projector)


@dataclass(frozen=True, slots=True)
class AudioInput:
    """An audio file as the client sent it (any container FFmpeg reads), and the bound its
    decoding keeps: decoding stops with a 400 once ``max_seconds`` of audio came out."""

    data: bytes
    filename: str = ""
    max_seconds: float = 3600.0


@dataclass(frozen=True, slots=True)
class SpeechJob:
    """What a speech model is asked: ``task`` "transcribe" (in the spoken language) or
    "translate" (into English); ``language``: ISO-639-1 code, None to detect it."""

    audio: AudioInput
    task: str = "transcribe"
    language: str | None = None
    prompt: str | None = None
    temperature: float = 0.0
    word_timestamps: bool = False


@dataclass(frozen=True, slots=True)
class TranscriptWord:
    word: str
    start: float
    end: float
    probability: float = 0.0


@dataclass(frozen=True, slots=True)
class TranscriptSegment:
    """One decoded window of speech, with Whisper's own measures of it (OpenAI's
    verbose_json segment fields)."""

    id: int
    seek: int
    start: float
    end: float
    text: str
    tokens: tuple[int, ...] = ()
    temperature: float = 0.0
    avg_logprob: float = 0.0
    compression_ratio: float = 0.0
    no_speech_prob: float = 0.0
    words: tuple[TranscriptWord, ...] = ()


class Transcript(Protocol):
    """A transcription under way: the language and duration are known when it starts; the
    segments come as the model decodes them."""

    language: str
    duration: float

    def __aiter__(self) -> AsyncIterator[TranscriptSegment]: ...

    def cancel(self) -> None: ...


@runtime_checkable
class Transcriber(Protocol):
    """A loaded model that turns speech into text (Whisper)."""

    async def transcribe(self, job: SpeechJob) -> Transcript:
        """Decode the audio (bounded) and start the model on it.

        Raises:
            InvalidRequest: the audio cannot be read or is over its bounds (param ``file``).
        """
        ...
