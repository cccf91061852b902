"""A fake runtime for scheduler and service tests: the real Worker over a scripted engine.

Only the native model is fake; the queue, cancellation and error paths are the real ones from
app.runtimes.worker.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence as Seq
from typing import Any

from app.core.inference.images import supports_vision
from app.core.types import GenerationRequest, LoadOptions, LocalModel, ModelFormat
from app.runtimes.worker import DeltaStream, Sequence, Worker

WAIT_LIMIT = 10.0  # a gate that never opens fails the test instead of hanging it


class ScriptEngine:
    """An Engine that replies with ``pieces``, one per step, then ends with "stop" (an EOS).

    ``pieces=None`` generates forever. Clearing ``gate`` makes ``begin`` wait (watching for
    cancellation, as llama.cpp's abort callback does); ``step_permits`` (a semaphore) makes each
    step wait for a permit and does not watch for cancellation: stopping is the worker's job.
    Requests whose ``request_id`` is in ``fail_begin`` / ``fail_step`` raise there. With
    ``hold_at``, the step that would write piece ``hold_at`` waits until its request is cancelled.
    """

    def __init__(
        self,
        pieces: Seq[str] | None = ("Hello", ",", " world"),
        *,
        max_sequences: int = 1,
        hold_at: int | None = None,
    ) -> None:
        self.pieces = None if pieces is None else list(pieces)
        self.hold_at = hold_at
        self.max_sequences = max_sequences
        self.gate = threading.Event()
        self.gate.set()
        self.step_permits: threading.Semaphore | None = None
        self.began = threading.Event()
        self.begun: list[str] = []
        self.ended: list[str] = []
        self.steps = 0
        self.widest_step = 0
        self.fail_begin: set[str] = set()
        self.fail_step: set[str] = set()
        self.shut_down = threading.Event()
        self.thread_names: set[str] = set()

    def begin(self, seq: Sequence) -> None:
        self.thread_names.add(threading.current_thread().name)
        rid = seq.request.request_id
        self.begun.append(rid)
        self.began.set()
        if rid in self.fail_begin:
            raise RuntimeError(f"prompt failed for {rid}")
        deadline = time.monotonic() + WAIT_LIMIT
        while not self.gate.wait(0.005):
            if seq.cancelled:
                return
            if time.monotonic() > deadline:
                raise RuntimeError("test gate never opened")
        seq.engine_state = 0

    def step(self, seqs: list[Sequence]) -> None:
        self.steps += 1
        self.widest_step = max(self.widest_step, len(seqs))
        if self.step_permits is not None and not self.step_permits.acquire(timeout=WAIT_LIMIT):
            raise RuntimeError("no step permit")
        for s in seqs:
            if s.request.request_id in self.fail_step:
                raise RuntimeError(f"decode failed for {s.request.request_id}")
            i = s.engine_state if isinstance(s.engine_state, int) else 0
            if i == self.hold_at:
                deadline = time.monotonic() + WAIT_LIMIT
                while not s.cancelled:
                    if time.monotonic() > deadline:
                        raise RuntimeError("the held request was never cancelled")
                    time.sleep(0.005)
                continue
            if self.pieces is None:
                s.engine_state = i + 1
                s.emit_text(f"t{i} ")
            elif i >= len(self.pieces):
                s.finish("stop")
            else:
                s.engine_state = i + 1
                s.emit_text(self.pieces[i])

    def end(self, seq: Sequence) -> None:
        self.ended.append(seq.request.request_id)

    def shutdown(self) -> None:
        self.shut_down.set()


class FakeModel:
    """The LoadedModel protocol over a real Worker. One token per character; BOS id 1."""

    BOS_ID = 1
    max_token_bytes = 4  # one token per character: at most 4 UTF-8 bytes

    def __init__(
        self,
        model_id: str,
        context_length: int,
        chat_template: str | None,
        engine: ScriptEngine,
        *,
        queue_size: int = 4,
        add_bos: bool = True,
        vision: bool = False,
    ) -> None:
        self.model_id = model_id
        self.vision = vision  # the model has a projector: it takes images
        self.images_seen: list[tuple[Any, ...]] = []
        self.context_length = context_length
        self._template = chat_template
        self.engine = engine
        self.add_bos = add_bos
        self.worker = Worker(engine, name=model_id, queue_size=queue_size)
        self.submit_calls = 0
        self.submitted: list[GenerationRequest] = []
        self.checked_constraints: list[tuple[str, str]] = []
        self.closed = False

    @property
    def chat_template(self) -> str | None:
        return self._template

    @property
    def special_tokens(self) -> dict[str, Any]:
        return {"bos": "<s>", "eos": "</s>", "bos_id": self.BOS_ID, "eos_id": 2, "n_vocab": 70_000}

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        toks = [self.BOS_ID] if add_special and self.add_bos else []
        i = 0
        while i < len(text):
            if parse_special and text.startswith("<s>", i):
                toks.append(self.BOS_ID)
                i += 3
            else:
                toks.append(10 + ord(text[i]))
                i += 1
        return toks

    @property
    def capabilities(self) -> frozenset[str]:
        return frozenset(
            {"completion", "chat", "vision"} if self.vision else {"completion", "chat"}
        )

    async def tokenize_images(self, text: str, images: tuple[Any, ...]) -> list[int]:
        """A prompt with images: the text's tokens (each marker as its characters); the images
        are kept for the test to look at."""
        self.images_seen.append(images)
        return self.tokenize(text, add_special=True, parse_special=True)

    async def embed(self, inputs: list[list[int]]) -> list[list[float]]:
        raise RuntimeError("the fake model only generates")

    async def check_constraint(self, constraint: tuple[str, str]) -> None:
        self.checked_constraints.append(constraint)  # the script engine ignores constraints

    def submit(self, request: GenerationRequest) -> DeltaStream:
        self.submit_calls += 1
        stream = self.worker.submit(request)
        self.submitted.append(request)
        return stream

    @property
    def pending(self) -> int:
        return self.worker.pending

    @property
    def queue_full(self) -> bool:
        return self.worker.queue_full

    def close(self) -> None:
        self.worker.close(timeout=WAIT_LIMIT)
        self.closed = True


class FakeRuntime:
    """The Runtime protocol. ``load`` takes ``delay`` seconds and fails the first ``fail_times``."""

    name = "fake"
    formats: Seq[ModelFormat] = ("gguf",)
    engine_type: type[ScriptEngine] = ScriptEngine  # a subclass scripts more of the engine

    def __init__(
        self,
        *,
        delay: float = 0.2,
        fail_times: int = 0,
        error: Exception | None = None,
        pieces: Seq[str] | None = ("Hello", ",", " world"),
        queue_size: int = 4,
        add_bos: bool = True,
        is_available: bool = True,
        hold_at: int | None = None,
    ) -> None:
        self.delay = delay
        self.fail_times = fail_times
        self.error = error
        self.pieces = pieces
        self.hold_at = hold_at
        self.queue_size = queue_size
        self.add_bos = add_bos
        self.is_available = is_available
        self.load_gate = threading.Event()  # clear it to hold every load until it is set
        self.load_gate.set()
        self.calls = 0
        self.options: list[LoadOptions] = []
        self.models: list[FakeModel] = []
        self._lock = threading.Lock()

    def available(self) -> bool:
        return self.is_available

    def load(self, model: LocalModel, options: LoadOptions) -> FakeModel:
        with self._lock:
            self.calls += 1
            n = self.calls
            self.options.append(options)
        time.sleep(self.delay)
        if not self.load_gate.wait(WAIT_LIMIT):
            raise RuntimeError("test load gate never opened")
        if n <= self.fail_times:
            raise self.error or RuntimeError("failed to allocate the KV cache (fake)")
        ctx = options.context_length or model.context_length or 2048
        lm = FakeModel(
            model.id,
            ctx,
            model.chat_template,
            self.engine_type(self.pieces, hold_at=self.hold_at),
            queue_size=self.queue_size,
            add_bos=self.add_bos,
            vision=supports_vision(model),
        )
        self.models.append(lm)
        return lm
