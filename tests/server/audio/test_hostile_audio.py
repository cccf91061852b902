"""Hostile audio on a real `hearth serve` with a real Whisper model: uploads over
``audio.max_bytes`` stopped while they stream in, audio over ``audio.max_seconds`` refused on
its header or while it decodes (hours of silence compressed into kilobytes), absurd sample
rates, malformed and truncated files, forms without their file: each a 400 naming the bound
(``param`` ``file``). /health answers while a long upload decodes and is transcribed. Every
field of the two forms is classified as the registry says."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.server.protocols import fields_registry as reg
from app.settings import AudioSettings
from tests.conftest import Served, serving
from tests.support.speech import flac_silence, silence_wav, speak, wav_header, whisper_or_skip

pytestmark = pytest.mark.model

MAX_BYTES = 8_000_000
MAX_SECONDS = 240.0


@pytest.fixture(scope="module")
def hostile(
    tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path
) -> Iterator[tuple[Served, str, bytes]]:
    """(the server, its Whisper model's id, a short spoken clip) with small audio bounds."""
    whisper = whisper_or_skip()
    home = tmp_path_factory.mktemp("hostile-audio")
    clip = speak(home.parent / "fox.wav").read_bytes()

    def prepare(service: Any, paths: Any, store: Any) -> None:
        store.update(audio=AudioSettings(max_bytes=MAX_BYTES, max_seconds=MAX_SECONDS))

    with serving(home, smollm2_path, whisper, prepare=prepare) as s:
        wid = s.service.models.import_path(whisper)[0].id  # type: ignore[attr-defined]
        yield s, wid, clip


def _post(s: Served, wid: str, data: bytes, name: str = "a.wav", **fields: str) -> httpx.Response:
    with httpx.Client(base_url=s.root, timeout=300) as c:
        return c.post(
            "/v1/audio/transcriptions",
            data={"model": wid, **fields},
            files={"file": (name, data, "application/octet-stream")},
        )


def _refused(r: httpx.Response, *words: str) -> None:
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "file", err
    for w in words:
        assert w in err["message"], err


def test_the_clip_itself_is_taken(hostile: tuple[Served, str, bytes]) -> None:
    s, wid, clip = hostile
    r = _post(s, wid, clip)
    assert r.status_code == 200, r.text
    assert "lazy" in r.json()["text"].lower()


def test_a_declared_upload_over_max_bytes_is_refused_unread(
    hostile: tuple[Served, str, bytes],
) -> None:
    s, wid, _ = hostile
    _refused(_post(s, wid, b"\0" * (MAX_BYTES + 5_000_000)), f"{MAX_BYTES} bytes", "max_bytes")


def test_a_streamed_upload_is_cut_at_max_bytes(hostile: tuple[Served, str, bytes]) -> None:
    """No Content-Length: the file part is read chunk by chunk and refused at the bound."""
    s, wid, _ = hostile
    boundary = "hearthtestboundary"
    head = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="model"\r\n\r\n{wid}\r\n'
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="big.wav"\r\n'
        "Content-Type: audio/wav\r\n\r\n"
    ).encode()

    def body() -> Iterator[bytes]:
        yield head
        for _ in range((MAX_BYTES // 65536) + 8):  # a little over the bound
            yield b"\0" * 65536
        yield f"\r\n--{boundary}--\r\n".encode()

    with httpx.Client(base_url=s.root, timeout=300) as c:
        r = c.post(
            "/v1/audio/transcriptions",
            content=body(),
            headers={"Content-Type": f"multipart/form-data; boundary={boundary}"},
        )
    _refused(r, f"{MAX_BYTES} bytes")


def test_a_header_claiming_more_than_max_seconds_is_refused_before_decoding(
    hostile: tuple[Served, str, bytes],
) -> None:
    s, wid, _ = hostile
    frames = 300 * 8000  # five minutes of 8-bit 8 kHz audio: 2.4 MB, under max_bytes
    long = wav_header(8000, frames, bits=8) + b"\x80" * frames
    _refused(_post(s, wid, long), "240 seconds", "says it lasts 300 s", "max_seconds")


def test_compressed_hours_of_silence_stop_at_max_seconds(
    hostile: tuple[Served, str, bytes],
) -> None:
    s, wid, _ = hostile
    declared = flac_silence(600, hide_length=False)
    _refused(_post(s, wid, declared, "silence.flac"), "240 seconds", "says it lasts 600 s")
    hidden = flac_silence(600, hide_length=True)
    assert len(hidden) < 200_000  # ten minutes in a few kilobytes
    _refused(_post(s, wid, hidden, "silence.flac"), "240 seconds", "decoded")


@pytest.mark.parametrize("rate", [0, 4_000_000_000])
def test_an_absurd_sample_rate_is_refused(hostile: tuple[Served, str, bytes], rate: int) -> None:
    s, wid, _ = hostile
    data = wav_header(rate, 16_000) + b"\0\0" * 16_000
    _refused(_post(s, wid, data), f"{rate} Hz", "1000-768000 Hz")


def test_malformed_and_truncated_files_are_refused(hostile: tuple[Served, str, bytes]) -> None:
    s, wid, clip = hostile
    _refused(_post(s, wid, bytes(range(256)) * 64, "noise.mp3"), "not audio Hearth can read")
    _refused(_post(s, wid, clip[:30]), "not audio Hearth can read")
    _refused(_post(s, wid, b""), "not audio Hearth can read")
    # the first half of a clip is what it is: its words so far
    r = _post(s, wid, clip[: len(clip) // 2 + 1])
    assert r.status_code == 200, r.text


def test_a_form_without_its_file_or_not_a_form_is_refused(
    hostile: tuple[Served, str, bytes],
) -> None:
    s, wid, _ = hostile
    with httpx.Client(base_url=s.root, timeout=60) as c:
        r = c.post("/v1/audio/transcriptions", json={"model": wid, "file": "x"})
        _refused(r, "multipart/form-data")
        r = c.post("/v1/audio/transcriptions", data={"model": wid}, files={"other": b"x"})
        _refused(r, "no 'file' part")
        r = c.post(
            "/v1/audio/transcriptions",
            data={"model": wid, "prompt": "x" * 70_000},
            files={"file": ("a.wav", b"RIFF", "audio/wav")},
        )
        assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"


def test_health_answers_while_a_long_upload_is_decoded_and_transcribed(
    hostile: tuple[Served, str, bytes],
) -> None:
    s, wid, _ = hostile
    long = silence_wav(90)  # 2.9 MB, a minute and a half
    result: dict[str, httpx.Response] = {}
    worker = threading.Thread(target=lambda: result.setdefault("r", _post(s, wid, long)))
    worker.start()
    answered_meanwhile = 0
    with httpx.Client(base_url=s.root, timeout=60) as c:
        while worker.is_alive():
            h = c.get("/health")
            assert h.status_code in (200, 503), h.text  # 503: "busy" is an answer too
            answered_meanwhile += worker.is_alive()
    worker.join()
    assert result["r"].status_code == 200, result["r"].text
    assert answered_meanwhile >= 1


# -- the registry's walk, on the forms --------------------------------------------------------
SAMPLES = {
    "language": "en",
    "prompt": "A dog.",
    "response_format": "text",
    "temperature": "0.2",
    "stream": "false",
    "timestamp_granularities": None,  # needs verbose_json: walked by the transcription tests
}


@pytest.mark.parametrize("name", ["openai.audio.transcriptions", "openai.audio.translations"])
def test_the_walk_every_form_field_is_taken_or_refused_by_name(
    hostile: tuple[Served, str, bytes], name: str
) -> None:
    s, wid, clip = hostile
    path = "/v1/audio/" + name.rsplit(".", 1)[1]
    with httpx.Client(base_url=s.root, timeout=300) as c:
        for key, field in reg.TABLES[name].items():
            if key in ("file", "model") or (key in SAMPLES and SAMPLES[key] is None):
                continue
            value = "7" if field.how == "refused" else SAMPLES[key]
            r = c.post(
                path,
                data={"model": wid, key: value},
                files={"file": ("a.wav", clip, "audio/wav")},
            )
            if field.how == "refused":
                assert r.status_code == 400, (key, r.text)
                assert r.json()["error"]["param"] == key, (key, r.text)
                assert field.why in r.text, (key, r.text)
            else:
                assert r.status_code == 200, (key, r.text)
