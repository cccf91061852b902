"""Whisper models in process (faster-whisper over CTranslate2, int8 on the CPU).

Each loaded model has ONE worker thread that owns the native model and runs its
transcriptions one after another (CTranslate2 spreads one over ``cpu_threads``). Audio is
decoded before that, in the runtime's small decode pool (two threads, shared by its models),
so a long upload being decoded neither holds the model nor the event loop.
Tested by tests/server/audio/test_transcriptions.py.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import logging
import os
import sys
import threading
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from app.core.types import (
    Constraint,
    GenerationRequest,
    GenerationStream,
    LoadOptions,
    LocalModel,
    ModelFormat,
    SpeechJob,
    TranscriptSegment,
    TranscriptWord,
)
from app.errors import (
    HearthError,
    InvalidRequest,
    ModelLoadFailed,
    ModelUnloaded,
    NotSupported,
    QueueFull,
)
from app.runtimes.speech import audio
from app.runtimes.speech.audio import SpeechUnavailable

log = logging.getLogger(__name__)

DECODE_THREADS = 2  # audio files decoded at once, all speech models together
# OpenAI's temperature 0: Whisper's own fallback (hotter retries where decoding fails its checks)
FALLBACK_TEMPERATURES = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
_DONE = object()


def _whisper_model_class() -> Any:
    try:
        from faster_whisper import WhisperModel
    except ImportError as e:
        raise SpeechUnavailable() from e
    return WhisperModel


# (module, distribution): what the doctor reports the versions of
SPEECH_PACKAGES = (("faster_whisper", "faster-whisper"), ("ctranslate2", "ctranslate2"))


def _version(module: str, dist: str) -> str | None:
    """An imported package's ``__version__`` (a frozen bundle carries no package metadata),
    else its installed distribution's; None: not installed."""
    v = getattr(sys.modules.get(module), "__version__", None)
    if isinstance(v, str):
        return v
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _languages() -> frozenset[str]:
    try:
        from faster_whisper.tokenizer import _LANGUAGE_CODES
    except ImportError:
        return frozenset()
    return frozenset(_LANGUAGE_CODES)


class SegmentStream:
    """A transcription under way (the ``Transcript`` protocol): its segments cross from the
    worker thread to the event loop through a queue."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self.started: asyncio.Future[None] = loop.create_future()
        self.cancelled = threading.Event()
        self.language = ""
        self.duration = 0.0

    # -- the worker thread's side ----------------------------------------------------------------
    def _call(self, fn: Any, *args: Any) -> None:
        try:
            self._loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the loop is closed: nobody waits any more
            pass

    def begin(self, language: str, duration: float) -> None:
        self.language, self.duration = language, duration
        self._call(_settle, self.started, None)

    def put(self, segment: TranscriptSegment) -> None:
        self._call(self._queue.put_nowait, segment)

    def end(self, error: BaseException | None = None) -> None:
        if error is not None:
            self._call(_settle, self.started, error)
        self._call(self._queue.put_nowait, error if error is not None else _DONE)

    # -- the event loop's side -------------------------------------------------------------------
    async def __aiter__(self) -> AsyncIterator[TranscriptSegment]:
        try:
            while True:
                item = await self._queue.get()
                if item is _DONE:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            self.cancel()  # a consumer that stops early (client gone, time limit) stops the model

    def cancel(self) -> None:
        self.cancelled.set()


def _settle(fut: asyncio.Future[None], error: BaseException | None) -> None:
    if fut.done():
        return
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(None)


class SpeechModel:
    """A loaded Whisper model: a ``LoadedModel`` the scheduler keeps, and a ``Transcriber``."""

    context_length = 448  # Whisper's text context

    def __init__(
        self, model_id: str, native: Any, decode_pool: ThreadPoolExecutor, queue_size: int
    ) -> None:
        self.model_id = model_id
        self._native = native
        self._decode_pool = decode_pool
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"whisper-{model_id}")
        self._queue_size = max(1, queue_size)
        self._pending = 0
        self._streams: set[SegmentStream] = set()
        self._closed = False
        self._languages = _languages()

    # -- transcribing ----------------------------------------------------------------------------
    async def transcribe(self, job: SpeechJob) -> SegmentStream:
        if self._closed:
            raise ModelUnloaded(f"the model '{self.model_id}' was unloaded")
        if job.language and self._languages and job.language not in self._languages:
            raise InvalidRequest(
                f"'{job.language}' is not a language Whisper knows; send an ISO-639-1 code "
                "such as 'en' or 'de', or leave it out to detect the language",
                param="language",
            )
        if self._pending >= self._queue_size:
            raise QueueFull(f"{self._pending} transcriptions are waiting for this model")
        loop = asyncio.get_running_loop()
        self._pending += 1
        stream = SegmentStream(loop)
        try:
            samples = await loop.run_in_executor(self._decode_pool, audio.decode, job.audio)
            if self._closed:
                raise ModelUnloaded(f"the model '{self.model_id}' was unloaded")
            fut = loop.run_in_executor(self._worker, self._run, samples, job, stream)
        except BaseException:
            self._pending -= 1
            raise
        self._streams.add(stream)
        fut.add_done_callback(lambda _f: self._finished(stream))
        try:
            await stream.started
        except BaseException:
            stream.cancel()
            raise
        return stream

    def _finished(self, stream: SegmentStream) -> None:
        self._pending -= 1
        self._streams.discard(stream)

    def _run(self, samples: Any, job: SpeechJob, stream: SegmentStream) -> None:
        """On the worker thread: the model over the samples, segment by segment."""
        if stream.cancelled.is_set() or self._native is None:
            stream.end(ModelUnloaded(f"the model '{self.model_id}' was unloaded"))
            return
        try:
            temperature = list(FALLBACK_TEMPERATURES) if job.temperature <= 0 else [job.temperature]
            segments, info = self._native.transcribe(
                samples,
                language=job.language or None,
                task=job.task,
                initial_prompt=job.prompt or None,
                temperature=temperature,
                word_timestamps=job.word_timestamps,
                vad_filter=False,
            )
            stream.begin(info.language, float(info.duration))
            for seg in segments:
                if stream.cancelled.is_set():
                    break
                stream.put(_segment(seg))
            stream.end()
        except HearthError as e:
            stream.end(e)
        except Exception as e:  # the engine's own failure: a 500 with its words
            log.exception("%s: transcription failed", self.model_id)
            stream.end(HearthError(f"the transcription failed: {e}"))

    @property
    def pending(self) -> int:
        return self._pending

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for s in list(self._streams):
            s.cancel()
        self._worker.submit(self._drop)  # after what runs now: the native model goes with it
        self._worker.shutdown(wait=False)

    def _drop(self) -> None:
        self._native = None

    # -- the LoadedModel protocol: a speech model has no text-generation side ---------------------
    @property
    def capabilities(self) -> frozenset[str]:
        return frozenset({"transcription", "translation"})

    @property
    def chat_template(self) -> str | None:
        return None

    @property
    def special_tokens(self) -> dict[str, Any]:
        return {}

    @property
    def max_token_bytes(self) -> int:
        return 1

    def _not_text(self) -> NotSupported:
        return NotSupported(
            f"'{self.model_id}' is a speech-to-text model: it serves /v1/audio/transcriptions "
            "and /v1/audio/translations only",
            param="model",
        )

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        raise self._not_text()

    def detokenize(self, tokens: list[int]) -> str:
        raise self._not_text()

    def token_pieces(self, tokens: list[int]) -> list[str]:
        raise self._not_text()

    def submit(self, request: GenerationRequest) -> GenerationStream:
        raise self._not_text()

    async def check_constraint(self, constraint: Constraint) -> None:
        raise self._not_text()

    async def embed(self, inputs: list[list[int]]) -> list[list[float]]:
        raise self._not_text()

    async def rank(self, query: list[int], documents: list[list[int]]) -> tuple[list[float], int]:
        raise self._not_text()


def _segment(seg: Any) -> TranscriptSegment:
    words = tuple(
        TranscriptWord(w.word, float(w.start), float(w.end), float(w.probability))
        for w in (seg.words or ())
    )
    return TranscriptSegment(
        id=int(seg.id),
        seek=int(seg.seek),
        start=float(seg.start),
        end=float(seg.end),
        text=seg.text,
        tokens=tuple(int(t) for t in seg.tokens),
        temperature=float(seg.temperature or 0.0),
        avg_logprob=float(seg.avg_logprob),
        compression_ratio=float(seg.compression_ratio),
        no_speech_prob=float(seg.no_speech_prob),
        words=words,
    )


class SpeechRuntime:
    """faster-whisper: CTranslate2 Whisper folders, on the CPU (int8)."""

    name = "faster-whisper"
    formats: Sequence[ModelFormat] = ("whisper",)

    def __init__(self, queue_size: int = 64) -> None:
        self._queue_size = queue_size
        self._decode_pool = ThreadPoolExecutor(
            max_workers=DECODE_THREADS, thread_name_prefix="audio-decode"
        )

    def available(self) -> bool:
        # True even without faster-whisper: a load then says which extra to install
        return True

    def system_report(self) -> dict[str, Any]:
        """{"speech": {available, reason, faster_whisper, ctranslate2}}: the versions installed
        (None: not installed)."""
        try:
            _whisper_model_class()
        except SpeechUnavailable as e:
            report = {"available": False, "reason": e.message}
        else:
            report = {"available": True, "reason": ""}
        versions = {m: _version(m, dist) for m, dist in SPEECH_PACKAGES}
        return {"speech": {**report, **versions}}

    def load(self, model: LocalModel, options: LoadOptions) -> SpeechModel:
        whisper = _whisper_model_class()
        threads = options.threads or os.cpu_count() or 1
        try:
            native = whisper(
                model.path, device="cpu", compute_type="int8", cpu_threads=threads, num_workers=1
            )
        except (RuntimeError, ValueError, OSError) as e:
            raise ModelLoadFailed(f"{model.id}: faster-whisper could not load it: {e}") from e
        return SpeechModel(model.id, native, self._decode_pool, self._queue_size)

    def close(self) -> None:
        self._decode_pool.shutdown(wait=False, cancel_futures=True)
