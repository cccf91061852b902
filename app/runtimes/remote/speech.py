"""Speech to text on an engine elsewhere (vLLM, another Hearth): the request as OpenAI's
multipart form, always asking for ``verbose_json`` (segments and, when asked, words), and that
answer read back into segments. Pure: the client sends the form.
Tested by tests/server/audio/test_provider_speech.py."""

from __future__ import annotations

import math
from typing import Any

from app.core.requests import TranscriptionRequest
from app.core.types import TranscriptSegment, TranscriptWord

MAX_SEGMENTS = 100_000  # an answer's segments and words read, at most


def form_fields(remote_id: str, req: TranscriptionRequest) -> list[tuple[str, str]]:
    """The form's text fields (the file goes beside them)."""
    job = req.job
    fields = [("model", remote_id), ("response_format", "verbose_json")]
    fields.append(("timestamp_granularities[]", "segment"))
    if job.word_timestamps:
        fields.append(("timestamp_granularities[]", "word"))
    if job.language and job.task == "transcribe":
        fields.append(("language", job.language))
    if job.prompt:
        fields.append(("prompt", job.prompt))
    if job.temperature:
        fields.append(("temperature", repr(job.temperature)))
    return fields


def _num(v: Any, default: float = 0.0) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        return default
    return float(v)


def _word(w: Any) -> TranscriptWord | None:
    if not isinstance(w, dict) or not isinstance(w.get("word"), str):
        return None
    return TranscriptWord(" " + w["word"].strip(), _num(w.get("start")), _num(w.get("end")))


def read_verbose(out: Any) -> tuple[str, float, list[TranscriptSegment]] | None:
    """(language, duration, segments) of a verbose_json answer; None: not one. An answer
    without segments (text only) is one segment; its words go to the segment they start in."""
    if not isinstance(out, dict) or not isinstance(out.get("text"), str):
        return None
    language = out.get("language") if isinstance(out.get("language"), str) else ""
    duration = _num(out.get("duration"))
    raw = out.get("segments")
    segments: list[TranscriptSegment] = []
    if isinstance(raw, list):
        for i, s in enumerate(raw[:MAX_SEGMENTS]):
            if not isinstance(s, dict) or not isinstance(s.get("text"), str):
                continue
            tokens = s.get("tokens")
            segments.append(
                TranscriptSegment(
                    id=int(_num(s.get("id"), i)),
                    seek=int(_num(s.get("seek"))),
                    start=_num(s.get("start")),
                    end=_num(s.get("end")),
                    text=s["text"],
                    tokens=tuple(t for t in tokens if isinstance(t, int))
                    if isinstance(tokens, list)
                    else (),
                    temperature=_num(s.get("temperature")),
                    avg_logprob=_num(s.get("avg_logprob")),
                    compression_ratio=_num(s.get("compression_ratio")),
                    no_speech_prob=_num(s.get("no_speech_prob")),
                )
            )
    if not segments:
        segments = [TranscriptSegment(0, 0, 0.0, duration, " " + out["text"].strip())]
    words = out.get("words")
    if isinstance(words, list):
        parsed = [w for w in map(_word, words[:MAX_SEGMENTS]) if w is not None]
        segments = _with_words(segments, parsed)
    return str(language), duration, segments


def _with_words(
    segments: list[TranscriptSegment], words: list[TranscriptWord]
) -> list[TranscriptSegment]:
    from dataclasses import replace

    groups: list[list[TranscriptWord]] = [[] for _ in segments]
    for w in words:
        i = next((k for k in range(len(segments) - 1, -1, -1) if segments[k].start <= w.start), 0)
        groups[i].append(w)
    return [replace(s, words=tuple(g)) for s, g in zip(segments, groups, strict=True)]
