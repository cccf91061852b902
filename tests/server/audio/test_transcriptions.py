"""OpenAI's speech-to-text routes on a real `hearth serve` with a real Whisper model
(CTranslate2, faster-whisper) and real speech (espeak-ng): every response format, streaming,
word timestamps, translations, openai-python's client, a chat model refused, `hearth ps`
and unload."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import Served, serving
from tests.support.hearthproc import hearth
from tests.support.speech import FOX_WORDS, speak, whisper_or_skip

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def clip(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    return speak(tmp_path_factory.mktemp("speech") / "fox.wav").read_bytes()


@pytest.fixture(scope="module")
def speech(
    tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path
) -> Iterator[tuple[Served, str]]:
    """A server with the chat model and the Whisper model: (server, the Whisper model's id)."""
    whisper = whisper_or_skip()
    with serving(tmp_path_factory.mktemp("speech-served"), smollm2_path, whisper) as s:
        wid = s.service.models.import_path(whisper)[0].id  # type: ignore[attr-defined]
        yield s, wid


def _post(s: Served, clip: bytes, path: str = "/v1/audio/transcriptions", **fields: object):  # type: ignore[no-untyped-def]
    data = {k: [str(x) for x in v] if isinstance(v, list) else str(v) for k, v in fields.items()}
    with httpx.Client(base_url=s.root, timeout=300) as c:
        return c.post(path, data=data, files={"file": ("fox.wav", clip, "audio/wav")})


def _has_words(text: str) -> bool:
    low = text.lower()
    return all(w in low for w in FOX_WORDS)


def test_json_is_the_transcript_with_its_duration(speech: tuple[Served, str], clip: bytes) -> None:
    s, wid = speech
    r = _post(s, clip, model=wid)
    assert r.status_code == 200, r.text
    body = r.json()
    assert _has_words(body["text"]), body
    assert body["usage"]["type"] == "duration" and body["usage"]["seconds"] >= 1
    assert r.headers["x-hearth-model"] == wid


def test_text_format_is_plain_text(speech: tuple[Served, str], clip: bytes) -> None:
    s, wid = speech
    r = _post(s, clip, model=wid, response_format="text")
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain")
    assert _has_words(r.text) and not r.text.lstrip().startswith("{")


def _cue_seconds(stamp: str) -> float:
    h, m, rest = stamp.replace(",", ".").split(":")
    return int(h) * 3600 + int(m) * 60 + float(rest)


def _cues(body: str, *, vtt: bool) -> list[tuple[float, float, str]]:
    """A small SRT / WebVTT parser: numbered cues (SRT) or the WEBVTT header (VTT), each
    ``HH:MM:SS,mmm --> HH:MM:SS,mmm`` (``.mmm`` in VTT) then its text."""
    sep = r"\." if vtt else ","
    stamp = rf"(\d\d:\d\d:\d\d{sep}\d\d\d)"
    if vtt:
        assert body.startswith("WEBVTT\n\n"), body
        body = body[len("WEBVTT\n\n") :]
    blocks = [b for b in body.strip().split("\n\n") if b.strip()]
    out = []
    for i, block in enumerate(blocks, 1):
        lines = block.split("\n")
        if not vtt:
            assert lines[0] == str(i), block  # cues numbered from 1
            lines = lines[1:]
        m = re.fullmatch(rf"{stamp} --> {stamp}", lines[0])
        assert m, block
        out.append((_cue_seconds(m[1]), _cue_seconds(m[2]), " ".join(lines[1:])))
    return out


@pytest.mark.parametrize("fmt", ["srt", "vtt"])
def test_subtitles_parse_with_increasing_times(
    speech: tuple[Served, str], clip: bytes, fmt: str
) -> None:
    s, wid = speech
    r = _post(s, clip, model=wid, response_format=fmt)
    assert r.status_code == 200, r.text
    cues = _cues(r.text, vtt=fmt == "vtt")
    assert cues
    last = 0.0
    for start, end, _text in cues:
        assert last <= start <= end
        last = end
    assert _has_words(" ".join(c[2] for c in cues))


def test_verbose_json_has_segments_and_monotonic_words(
    speech: tuple[Served, str], clip: bytes
) -> None:
    s, wid = speech
    r = _post(
        s,
        clip,
        model=wid,
        response_format="verbose_json",
        **{"timestamp_granularities[]": ["word", "segment"]},
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["task"] == "transcribe" and body["language"] == "english"
    assert 3 < body["duration"] < 10 and _has_words(body["text"])
    seg = body["segments"][0]
    for key in (
        "id", "seek", "start", "end", "text", "tokens", "temperature", "avg_logprob",
        "compression_ratio", "no_speech_prob",
    ):  # fmt: skip
        assert key in seg, key
    words = body["words"]
    assert len(words) >= 10
    last = 0.0
    for w in words:
        assert set(w) == {"word", "start", "end"}
        assert last <= w["start"] <= w["end"] <= body["duration"] + 0.01, w
        last = w["start"]


def test_word_timestamps_need_verbose_json(speech: tuple[Served, str], clip: bytes) -> None:
    s, wid = speech
    r = _post(s, clip, model=wid, **{"timestamp_granularities[]": "word"})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "timestamp_granularities"


def test_stream_sends_deltas_then_done(speech: tuple[Served, str], clip: bytes) -> None:
    s, wid = speech
    r = _post(s, clip, model=wid, stream="true")
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/event-stream")
    events = [
        json.loads(line[len("data: ") :])
        for line in r.text.splitlines()
        if line.startswith("data: ")
    ]
    deltas = [e for e in events if e["type"] == "transcript.text.delta"]
    assert deltas and events[-1]["type"] == "transcript.text.done"
    assert events[:-1] == deltas  # every delta before the one done
    assert "".join(d["delta"] for d in deltas) == events[-1]["text"]
    assert _has_words(events[-1]["text"])


def test_translation_answers_in_english(speech: tuple[Served, str], clip: bytes) -> None:
    s, wid = speech
    r = _post(s, clip, "/v1/audio/translations", model=wid, response_format="verbose_json")
    assert r.status_code == 200, r.text
    assert r.json()["task"] == "translate"
    assert "dog" in r.json()["text"].lower()


def test_a_chat_model_is_refused_as_the_transcription_model(
    speech: tuple[Served, str], clip: bytes
) -> None:
    s, _ = speech
    r = _post(s, clip, model=s.model_id)
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["param"] == "model" and "not a speech-to-text model" in err["message"]


def test_refused_fields_are_400s_naming_them(speech: tuple[Served, str], clip: bytes) -> None:
    s, wid = speech
    r = _post(s, clip, model=wid, **{"include[]": "logprobs"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "include"
    r = _post(s, clip, model=wid, known_speaker_names="ann")
    assert r.status_code == 400 and r.json()["error"]["param"] == "known_speaker_names"
    r = _post(s, clip, model=wid, response_format="mp3")
    assert r.status_code == 400 and r.json()["error"]["param"] == "response_format"
    r = _post(s, clip, model=wid, language="klingon")
    assert r.status_code == 400 and r.json()["error"]["param"] == "language"


def test_openai_python_transcribes_and_streams(speech: tuple[Served, str], clip: bytes) -> None:
    from openai import OpenAI

    s, wid = speech
    client = OpenAI(base_url=s.base_url, api_key="unused", timeout=300)
    out = client.audio.transcriptions.create(model=wid, file=("fox.wav", clip, "audio/wav"))
    assert _has_words(out.text)
    verbose = client.audio.transcriptions.create(
        model=wid,
        file=("fox.wav", clip, "audio/wav"),
        response_format="verbose_json",
        timestamp_granularities=["word"],
    )
    assert verbose.words and verbose.duration > 3
    stream = client.audio.transcriptions.create(
        model=wid, file=("fox.wav", clip, "audio/wav"), stream=True
    )
    events = list(stream)
    assert events[-1].type == "transcript.text.done"
    assert "".join(e.delta for e in events[:-1]) == events[-1].text  # type: ignore[union-attr]
    tr = client.audio.translations.create(model=wid, file=("fox.wav", clip, "audio/wav"))
    assert "dog" in tr.text.lower()


def test_ps_lists_the_loaded_speech_model_and_unload_frees_it(
    speech: tuple[Served, str], clip: bytes
) -> None:
    s, wid = speech
    assert _post(s, clip, model=wid).status_code == 200
    ps = hearth(s.home, None, "ps", "--json")
    assert ps.returncode == 0, ps.stderr
    loaded = {m["id"]: m for m in json.loads(ps.stdout)}
    assert loaded[wid]["runtime"] == "faster-whisper"
    assert loaded[wid]["memory_bytes"] > 75_000_000  # model.bin, at least
    with httpx.Client(base_url=s.root, timeout=120) as c:
        listed = c.get(f"/v1/models/{wid}").json()
        assert listed["state"] == "loaded" and "transcription" in listed["capabilities"]
    r = hearth(s.home, None, "unload", wid)
    assert r.returncode == 0, r.stderr
    with httpx.Client(base_url=s.root, timeout=120) as c:
        assert c.get(f"/v1/models/{wid}").json()["state"] == "not-loaded"
    assert _post(s, clip, model=wid).status_code == 200  # the next request loads it again
