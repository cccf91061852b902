"""The speech routes go through the same edge as every other: a key is needed where the server
has keys, a key scoped to other models finds the Whisper model as if it did not exist, a key's
request rate is charged, and a request that outlives the server's time limit is a 504 (or,
once a stream began, ends with an error event)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.core.gateway.keys import KeyStore
from tests.conftest import Served, serving
from tests.support.speech import flac_silence, speak, whisper_or_skip

pytestmark = pytest.mark.model

KEYS = {"free": "k-free-0123456789", "one": "k-one-0123456789", "scoped": "k-scoped-0123456789"}


class Clock:
    def __init__(self) -> None:
        self.t = 5000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture(scope="module")
def keyed(
    tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path
) -> Iterator[tuple[Served, str, bytes, Clock]]:
    whisper = whisper_or_skip()
    home = tmp_path_factory.mktemp("speech-keys")
    clip = speak(home.parent / "fox-keys.wav").read_bytes()
    made: dict[str, str] = {}

    def prepare(service: Any, paths: Any, store: Any) -> None:
        smol = next(s.model for s in service.models.all())
        made["wid"] = service.models.import_path(whisper)[0].id
        ks = KeyStore(paths.keys_file)
        ks.add("free", KEYS["free"])
        ks.add("one", KEYS["one"], rpm=1)
        ks.add("scoped", KEYS["scoped"], models=[smol.id])

    clock = Clock()
    with serving(home, smollm2_path, prepare=prepare, clock=clock, api_key="default-key-0123") as s:
        yield s, made["wid"], clip, clock


def _post(s: Served, key: str | None, model: str, clip: bytes) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    with httpx.Client(base_url=s.root, timeout=300) as c:
        return c.post(
            "/v1/audio/transcriptions",
            data={"model": model},
            files={"file": ("fox.wav", clip, "audio/wav")},
            headers=headers,
        )


def test_a_key_is_needed(keyed: tuple[Served, str, bytes, Clock]) -> None:
    s, wid, clip, _ = keyed
    r = _post(s, None, wid, clip)
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert _post(s, KEYS["free"], wid, clip).status_code == 200


def test_a_scoped_key_finds_the_speech_model_as_unknown(
    keyed: tuple[Served, str, bytes, Clock],
) -> None:
    s, wid, clip, _ = keyed
    hidden = _post(s, KEYS["scoped"], wid, clip)
    unknown = _post(s, KEYS["scoped"], "no-such-model", clip)
    assert hidden.status_code == unknown.status_code == 404
    assert hidden.text.replace(f"'{wid}'", "'X'") == unknown.text.replace("'no-such-model'", "'X'")


def test_a_keys_request_rate_is_charged(keyed: tuple[Served, str, bytes, Clock]) -> None:
    s, wid, clip, clock = keyed
    clock.t += 3600  # a full bucket
    assert _post(s, KEYS["one"], wid, clip).status_code == 200
    r = _post(s, KEYS["one"], wid, clip)
    assert r.status_code == 429, r.text
    assert r.json()["error"]["code"] == "rate_limit_exceeded"


def test_the_time_limit_ends_a_long_transcription(tmp_path: Path, smollm2_path: Path) -> None:
    whisper = whisper_or_skip()
    with serving(tmp_path / "limited", smollm2_path, whisper, request_timeout_s=1.0) as s:
        wid = s.service.models.import_path(whisper)[0].id  # type: ignore[attr-defined]
        s.call(s.service.models.load(wid))  # type: ignore[attr-defined]
        long = flac_silence(3000, hide_length=False)  # fifty minutes: a hundred windows
        with httpx.Client(base_url=s.root, timeout=300) as c:
            r = c.post(
                "/v1/audio/transcriptions",
                data={"model": wid},
                files={"file": ("long.flac", long, "audio/flac")},
            )
            assert r.status_code == 504, r.text
            assert "time limit" in r.json()["error"]["message"]
            r = c.post(
                "/v1/audio/transcriptions",
                data={"model": wid, "stream": "true"},
                files={"file": ("long.flac", long, "audio/flac")},
            )
            if r.status_code == 200:  # the stream had begun: its last event says why it ended
                assert "event: error" in r.text and "time limit" in r.text
            else:  # the limit came while the audio decoded or the model started
                assert r.status_code == 504, r.text
            # the model stops with the requests: nothing of them still waits or runs
            deadline = time.monotonic() + 120
            while c.get("/api/v1/ps").json()["models"][0]["pending_requests"]:
                assert time.monotonic() < deadline, "the cut transcriptions never stopped"
                time.sleep(0.05)


def test_without_faster_whisper_the_server_says_to_install_the_speech_extra(
    tmp_path: Path,
) -> None:
    from tests.e2e.serveproc import start_serve

    whisper = whisper_or_skip()
    blocker = tmp_path / "site"
    blocker.mkdir()
    # the third-party packages absent for the server process (their import fails)
    (blocker / "sitecustomize.py").write_text(
        "import sys\nsys.modules['faster_whisper'] = None\nsys.modules['av'] = None\n"
    )
    s = start_serve(tmp_path / "h", whisper, env_extra={"PYTHONPATH": str(blocker)})
    try:
        wid = next(iter(s.models.values()))
        with httpx.Client(base_url=s.root, timeout=120) as c:
            r = c.post(
                "/v1/audio/transcriptions",
                data={"model": wid},
                files={"file": ("a.wav", b"RIFF", "audio/wav")},
            )
        assert r.status_code == 503, r.text
        assert "install the speech extra" in r.json()["error"]["message"]
        assert s.alive()
    finally:
        s.stop()
