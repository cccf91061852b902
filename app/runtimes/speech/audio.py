"""Audio files decoded within bounds: whatever container and codec FFmpeg (PyAV) reads, to
16 kHz mono samples, as Whisper takes them.

A client's file is untrusted: the container is probed first (an audio stream, a sane sample
rate, a declared duration within the bound), then decoded while a running count of samples
stops at the bound, so a file that lies about its length (or compresses hours of silence into
a few kilobytes) costs no more than ``max_seconds`` of audio.
Tested by tests/server/audio/test_hostile_audio.py.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np

from app.core.types import AudioInput
from app.errors import InvalidRequest, RuntimeUnavailable

SAMPLE_RATE = 16_000  # what Whisper's feature extractor takes
MIN_SOURCE_RATE = 1_000  # Hz: below this nothing is speech (and a 0 Hz header is a lie)
MAX_SOURCE_RATE = 768_000  # Hz: the highest rate real audio interfaces record


class SpeechUnavailable(RuntimeUnavailable):
    """faster-whisper (and PyAV with it) is not installed: the speech extra."""

    status = 503

    def __init__(self) -> None:
        super().__init__(
            "speech models need the speech extra, which is not installed here: install the "
            "speech extra (pip install 'hearth[speech]', which brings faster-whisper)"
        )


class AudioRejected(InvalidRequest):
    """The file is not audio Hearth can read, or is over a bound (always the ``file`` part)."""

    code = "invalid_audio"


def _av() -> Any:
    try:
        import av
    except ImportError as e:  # PyAV comes with faster-whisper: the speech extra
        raise SpeechUnavailable() from e
    return av


def decode(audio: AudioInput) -> np.ndarray:
    """The file's first audio stream as 16 kHz mono float32 samples in [-1, 1].

    Raises:
        AudioRejected: no audio stream, a sample rate outside 1-768 kHz, more than
            ``audio.max_seconds`` of audio (declared or decoded), unreadable or empty data.
    """
    av = _av()
    limit = int(audio.max_seconds * SAMPLE_RATE)
    name = f" ({audio.filename})" if audio.filename else ""
    rate = _wav_rate(audio.data)  # FFmpeg refuses a WAV's absurd rate without saying so
    if rate is not None:
        _check_rate(rate, name)
    try:
        container = av.open(io.BytesIO(audio.data), mode="r", metadata_errors="ignore")
    except (av.FFmpegError, ValueError, OSError) as e:
        raise AudioRejected(
            f"the file{name} is not audio Hearth can read: {_reason(e)}", param="file"
        ) from None
    chunks: list[np.ndarray] = []
    count = 0
    try:
        with container:
            if not container.streams.audio:
                raise AudioRejected(f"the file{name} has no audio stream", param="file")
            stream = container.streams.audio[0]
            _check_rate(stream.codec_context.sample_rate or stream.rate or 0, name)
            declared = _declared_seconds(container, stream)
            if declared > audio.max_seconds:
                raise _too_long(audio.max_seconds, f"it says it lasts {declared:.0f} s")
            resampler = av.AudioResampler(format="s16", layout="mono", rate=SAMPLE_RATE)
            for frame in container.decode(stream):
                _check_rate(frame.sample_rate or 0, name)
                for out in resampler.resample(frame):
                    count = _take(out, chunks, count, limit, audio.max_seconds)
            for out in resampler.resample(None):  # what the resampler still holds
                count = _take(out, chunks, count, limit, audio.max_seconds)
    except AudioRejected:
        raise
    except (av.FFmpegError, ValueError, OSError, MemoryError) as e:
        raise AudioRejected(
            f"the audio{name} could not be decoded: {_reason(e)}", param="file"
        ) from None
    if count == 0:
        raise AudioRejected(f"the file{name} holds no audio samples", param="file")
    samples = np.concatenate(chunks) if len(chunks) > 1 else chunks[0]
    return samples.astype(np.float32) / 32768.0


def _take(frame: Any, chunks: list[np.ndarray], count: int, limit: int, seconds: float) -> int:
    data = frame.to_ndarray().reshape(-1)
    count += data.shape[0]
    if count > limit:  # stop here: the rest is never decoded
        raise _too_long(seconds, "more audio than that was decoded")
    chunks.append(data)
    return count


def _check_rate(rate: int, name: str) -> None:
    if not MIN_SOURCE_RATE <= rate <= MAX_SOURCE_RATE:
        raise AudioRejected(
            f"the audio{name} has a sample rate of {rate} Hz; Hearth reads "
            f"{MIN_SOURCE_RATE}-{MAX_SOURCE_RATE} Hz",
            param="file",
        )


def _wav_rate(data: bytes) -> int | None:
    """The sample rate a RIFF/WAVE header's first ``fmt `` chunk claims (None: not a WAV)."""
    if len(data) < 12 or data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        return None
    pos = 12
    while pos + 8 <= len(data) and pos < 4096:  # the fmt chunk comes first, near the start
        size = int.from_bytes(data[pos + 4 : pos + 8], "little")
        if data[pos : pos + 4] == b"fmt " and pos + 16 <= len(data):
            return int.from_bytes(data[pos + 12 : pos + 16], "little")
        pos += 8 + size + (size & 1)
    return None


def _declared_seconds(container: Any, stream: Any) -> float:
    """What the container says the stream lasts (0: it does not say)."""
    if stream.duration is not None and stream.time_base is not None:
        return float(stream.duration * stream.time_base)
    if container.duration is not None:
        return container.duration / 1_000_000  # av.time_base: microseconds
    return 0.0


def _too_long(seconds: float, why: str) -> AudioRejected:
    return AudioRejected(
        f"the audio is longer than the limit of {seconds:g} seconds ({why}); "
        "the server's audio.max_seconds setting sets it",
        param="file",
    )


def _reason(e: BaseException) -> str:
    strerror = getattr(e, "strerror", None)  # FFmpeg's own words, without the file's name
    text = (strerror if isinstance(strerror, str) and strerror else str(e)).strip()
    text = text or type(e).__name__
    return text[:200]
