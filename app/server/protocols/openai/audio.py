"""POST /v1/audio/transcriptions and /v1/audio/translations as OpenAI documents them: a
multipart form (``file``, ``model``, ``language``, ``prompt``, ``response_format``,
``temperature``, ``timestamp_granularities[]``, ``stream``) -> ``json`` ``{text, usage}``,
``text``, ``srt``, ``vtt`` or ``verbose_json`` (task, language, duration, text, segments,
words); ``stream``: ``transcript.text.delta`` events, then ``transcript.text.done``.
Parse and render only (the form is read at the edge: app/server/edge/audio.py).
Tested by tests/server/audio/test_transcriptions.py.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from app.core.requests import TranscriptionRequest
from app.core.types import AudioInput, SpeechJob, TranscriptSegment
from app.errors import InvalidRequest
from app.server.protocols.fields_registry import (
    OPENAI_TRANSCRIPTIONS,
    OPENAI_TRANSLATIONS,
    refuse_unhonoured,
)

FORMATS = ("json", "text", "srt", "vtt", "verbose_json")
GRANULARITIES = ("segment", "word")
STREAMED = ("json", "text")  # a stream carries text: the formats whose answer is the text
MAX_PROMPT_CHARS = 4096  # Whisper reads the last 224 tokens of it
CONTENT_TYPES = {
    "json": "application/json",
    "verbose_json": "application/json",
    "text": "text/plain",
    "srt": "application/x-subrip",
    "vtt": "text/vtt",
}
# the names OpenAI's verbose_json gives the languages (the code where none is listed here)
LANGUAGE_NAMES = {
    "en": "english", "de": "german", "fr": "french", "es": "spanish", "it": "italian",
    "pt": "portuguese", "nl": "dutch", "ru": "russian", "uk": "ukrainian", "pl": "polish",
    "cs": "czech", "sv": "swedish", "da": "danish", "no": "norwegian", "fi": "finnish",
    "tr": "turkish", "el": "greek", "ar": "arabic", "he": "hebrew", "hi": "hindi",
    "zh": "chinese", "ja": "japanese", "ko": "korean", "vi": "vietnamese", "th": "thai",
    "id": "indonesian", "ms": "malay", "ro": "romanian", "hu": "hungarian", "ca": "catalan",
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class ParsedAudio:
    """A speech request and how the client wants it answered."""

    request: TranscriptionRequest
    response_format: str
    stream: bool
    granularities: tuple[str, ...]


def _one(fields: Mapping[str, Sequence[str]], key: str) -> str | None:
    values = fields.get(key) or fields.get(f"{key}[]")
    return values[-1] if values else None


def _flat(fields: Mapping[str, Sequence[str]]) -> dict[str, Any]:
    """The form as the registry sees it: ``name[]`` is ``name``, repeats are a list."""
    out: dict[str, Any] = {}
    for key, values in fields.items():
        name = key[:-2] if key.endswith("[]") else key
        out[name] = list(values) if key.endswith("[]") or len(values) > 1 else values[0]
    return out


def parse(fields: Mapping[str, Sequence[str]], audio: AudioInput, *, task: str) -> ParsedAudio:
    """The form's fields (the file already read) -> the request.

    Raises:
        InvalidRequest: a field out of its range, naming it; UnsupportedParameter: a refused
            field that asks for something (chunking, diarization, logprobs).
    """
    table = OPENAI_TRANSLATIONS if task == "translate" else OPENAI_TRANSCRIPTIONS
    flat = _flat(fields)
    refuse_unhonoured(flat, table)
    fmt = (_one(fields, "response_format") or "json").strip()
    if fmt not in FORMATS:
        raise InvalidRequest(
            f"'response_format' must be one of {', '.join(FORMATS)}", param="response_format"
        )
    grains = tuple(fields.get("timestamp_granularities[]", ())) + tuple(
        fields.get("timestamp_granularities", ())
    )
    for g in grains:
        if g not in GRANULARITIES:
            raise InvalidRequest(
                "'timestamp_granularities[]' takes segment and word",
                param="timestamp_granularities",
            )
    if grains and fmt != "verbose_json":  # as OpenAI: timestamps are verbose_json's
        raise InvalidRequest(
            "'timestamp_granularities[]' needs response_format verbose_json",
            param="timestamp_granularities",
        )
    stream = _flag(_one(fields, "stream"), "stream")
    if stream and fmt not in STREAMED:
        raise InvalidRequest(
            f"a stream carries the text only: response_format {fmt} cannot be streamed",
            param="stream",
        )
    temperature = _number(_one(fields, "temperature"), "temperature", 0.0, 1.0)
    prompt = _one(fields, "prompt")
    if prompt is not None and len(prompt) > MAX_PROMPT_CHARS:
        raise InvalidRequest(f"'prompt' is over {MAX_PROMPT_CHARS} characters", param="prompt")
    language = (_one(fields, "language") or "").strip().lower() or None
    if task == "translate":
        language = None  # the audio's language is detected; the answer is English
    job = SpeechJob(
        audio=audio,
        task=task,
        language=language,
        prompt=prompt or None,
        temperature=temperature,
        word_timestamps="word" in grains,
    )
    model = (_one(fields, "model") or "").strip()
    req = TranscriptionRequest(model=model, job=job)
    return ParsedAudio(req, fmt, stream, grains or ("segment",))


def _flag(raw: str | None, key: str) -> bool:
    if raw is None or raw.strip() == "":
        return False
    v = raw.strip().lower()
    if v in ("true", "1"):
        return True
    if v in ("false", "0"):
        return False
    raise InvalidRequest(f"'{key}' must be true or false", param=key)


def _number(raw: str | None, key: str, lo: float, hi: float) -> float:
    if raw is None or raw.strip() == "":
        return lo
    try:
        v = float(raw)
    except ValueError:
        raise InvalidRequest(f"'{key}' must be a number", param=key) from None
    if not math.isfinite(v) or not lo <= v <= hi:
        raise InvalidRequest(f"'{key}' must be between {lo:g} and {hi:g}", param=key)
    return v


# -- answers -------------------------------------------------------------------------------------
def full_text(segments: Sequence[TranscriptSegment]) -> str:
    return "".join(s.text for s in segments).strip()


def usage(duration: float) -> dict[str, Any]:
    """OpenAI's usage for audio billed by length: whole seconds, rounded up."""
    return {"type": "duration", "seconds": math.ceil(duration)}


def render(
    parsed: ParsedAudio, segments: Sequence[TranscriptSegment], language: str, duration: float
) -> tuple[str, str]:
    """The whole answer in the asked format: (body, content type)."""
    fmt = parsed.response_format
    text = full_text(segments)
    if fmt == "text":
        body = text + "\n"
    elif fmt == "srt":
        body = subtitles(segments, vtt=False)
    elif fmt == "vtt":
        body = subtitles(segments, vtt=True)
    elif fmt == "verbose_json":
        body = json.dumps(verbose(parsed, segments, language, duration, text))
    else:
        body = json.dumps({"text": text, "usage": usage(duration)})
    return body, CONTENT_TYPES[fmt]


def verbose(
    parsed: ParsedAudio,
    segments: Sequence[TranscriptSegment],
    language: str,
    duration: float,
    text: str,
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "task": parsed.request.job.task,
        "language": LANGUAGE_NAMES.get(language, language),
        "duration": round(duration, 3),
        "text": text,
    }
    if "segment" in parsed.granularities:
        out["segments"] = [_segment(s) for s in segments]
    if "word" in parsed.granularities:
        out["words"] = [
            {"word": w.word.strip(), "start": round(w.start, 3), "end": round(w.end, 3)}
            for s in segments
            for w in s.words
        ]
    out["usage"] = usage(duration)
    return out


def _segment(s: TranscriptSegment) -> dict[str, Any]:
    return {
        "id": s.id,
        "seek": s.seek,
        "start": round(s.start, 3),
        "end": round(s.end, 3),
        "text": s.text,
        "tokens": list(s.tokens),
        "temperature": s.temperature,
        "avg_logprob": s.avg_logprob,
        "compression_ratio": s.compression_ratio,
        "no_speech_prob": s.no_speech_prob,
    }


def timestamp(seconds: float, *, vtt: bool) -> str:
    """``HH:MM:SS,mmm`` (SRT) or ``HH:MM:SS.mmm`` (WebVTT)."""
    ms = max(0, round(seconds * 1000))
    h, rest = divmod(ms, 3_600_000)
    m, rest = divmod(rest, 60_000)
    s, ms = divmod(rest, 1000)
    return f"{h:02d}:{m:02d}:{s:02d}{'.' if vtt else ','}{ms:03d}"


def subtitles(segments: Sequence[TranscriptSegment], *, vtt: bool) -> str:
    """One cue per segment: SRT numbers them from 1; WebVTT opens with its header."""
    cues = []
    for i, s in enumerate(segments, 1):
        times = f"{timestamp(s.start, vtt=vtt)} --> {timestamp(s.end, vtt=vtt)}"
        text = s.text.strip().replace("-->", "->")  # a cue's text never holds the arrow
        cues.append(f"{times}\n{text}\n" if vtt else f"{i}\n{times}\n{text}\n")
    head = "WEBVTT\n\n" if vtt else ""
    return head + "\n".join(cues)


class TextStream:
    """The stream's events: each segment's text as a ``transcript.text.delta`` (the first
    without its leading space), then ``transcript.text.done`` with their join."""

    def __init__(self) -> None:
        self._parts: list[str] = []

    def delta(self, segment: TranscriptSegment) -> dict[str, Any] | None:
        text = segment.text if self._parts else segment.text.lstrip()
        if not text:
            return None
        self._parts.append(text)
        return {"type": "transcript.text.delta", "delta": text}

    def done(self) -> dict[str, Any]:
        return {"type": "transcript.text.done", "text": "".join(self._parts)}
