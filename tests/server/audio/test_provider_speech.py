"""Speech to text through a provider: a front `hearth serve` forwards the multipart request to
another real `hearth serve` (a provider of kind "hearth") that runs the Whisper model; the
answer comes back in every format the client asks for, words included."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.core.gateway.providers.store import ProviderConfig
from tests.conftest import serving
from tests.support.speech import FOX_WORDS, speak, whisper_or_skip

pytestmark = pytest.mark.model


def test_a_provider_transcribes_for_the_front(tmp_path: Path, smollm2_path: Path) -> None:
    whisper = whisper_or_skip()
    clip = speak(tmp_path / "fox.wav").read_bytes()
    with serving(tmp_path / "back", smollm2_path, whisper) as back:
        wid = back.service.models.import_path(whisper)[0].id  # type: ignore[attr-defined]

        def prepare(service: Any, paths: Any, store: Any) -> None:
            service.routing.add_provider(ProviderConfig("up", back.base_url, kind="hearth"), None)

        with serving(tmp_path / "front", smollm2_path, prepare=prepare) as front:
            target = f"up/{wid}"
            with httpx.Client(base_url=front.root, timeout=300) as c:
                deadline = time.monotonic() + 60
                while target not in {m["id"] for m in c.get("/v1/models").json()["data"]}:
                    assert time.monotonic() < deadline, "the provider's models never listed"
                    time.sleep(0.05)

                def post(path: str = "/v1/audio/transcriptions", **fields: Any) -> httpx.Response:
                    return c.post(
                        path,
                        data={"model": target, **fields},
                        files={"file": ("fox.wav", clip, "audio/wav")},
                    )

                r = post()
                assert r.status_code == 200, r.text
                assert all(w in r.json()["text"].lower() for w in FOX_WORDS), r.text
                assert r.headers["x-hearth-model"] == target
                r = post(response_format="verbose_json", **{"timestamp_granularities[]": "word"})
                assert r.status_code == 200, r.text
                body = r.json()
                assert body["language"] == "english" and body["duration"] > 3
                starts = [w["start"] for w in body["words"]]
                assert len(starts) >= 10 and starts == sorted(starts)
                r = post(response_format="srt")
                assert r.status_code == 200 and r.text.startswith("1\n00:00:00,000 --> ")
                r = post("/v1/audio/translations", response_format="verbose_json")
                assert r.status_code == 200 and json.loads(r.text)["task"] == "translate"
                # the provider's own refusal comes back as the engine said it
                r = c.post(
                    "/v1/audio/transcriptions",
                    data={"model": target},
                    files={"file": ("noise.wav", b"not audio" * 100, "audio/wav")},
                )
                assert r.status_code == 400, r.text
                assert "not audio Hearth can read" in r.json()["error"]["message"]
