"""`hearth pull` of a Whisper (CTranslate2) repo from the fake Hub, as a script runs it: the
folder is downloaded verified, a pull killed halfway resumes where its bytes stopped, the
library lists the model for transcription, and `hearth transcribe` on it hears the espeak-ng
clip (the real test model's files, served by the fake Hub)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import start_served, stop_served
from tests.support.fakehub import FakeFile, FakeHub, gguf_bytes
from tests.support.hearthproc import hearth, kill_pull_at, ls
from tests.support.speech import FOX_WORDS, speak, whisper_or_skip

REPO = "Systran/faster-whisper-test"
TAGS = ["ctranslate2", "audio", "automatic-speech-recognition", "en", "license:mit"]


@pytest.fixture
def hub(fake_hub: FakeHub) -> FakeHub:
    real = whisper_or_skip()
    files: dict[str, bytes | FakeFile] = {
        f.name: f.read_bytes() for f in real.iterdir() if f.is_file()
    }
    files["README.md"] = b"# a Whisper model in CTranslate2's format\n"
    fake_hub.add_repo(REPO, files, tags=TAGS, library_name="ctranslate2", downloads=3)
    return fake_hub


def test_search_lists_it_as_whisper(hub: FakeHub, tmp_path: Path) -> None:
    table = hearth(tmp_path, hub, "search", "whisper", "--format", "whisper")
    assert table.returncode == 0, table.stderr
    header, row = table.stdout.splitlines()
    assert row.split()[:2] == [REPO, "whisper"]


def test_the_servers_hub_api_searches_and_offers_whisper(hub: FakeHub, tmp_path: Path) -> None:
    seed = tmp_path / "seed" / "seed-Q8_0.gguf"
    seed.parent.mkdir(parents=True)
    seed.write_bytes(gguf_bytes(tmp_path / "b", name="seed", file_type=7))
    s = start_served(tmp_path / "served", seed)  # its HubClient reads HF_ENDPOINT (the fake)

    def get(path: str) -> tuple[int, Any]:
        try:
            with urllib.request.urlopen(s.root + path, timeout=60) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    try:
        status, found = get("/api/v1/hub/search?q=whisper&format=whisper")
        assert status == 200, found
        assert [(m["id"], m["format"]) for m in found["models"]] == [(REPO, "whisper")]
        status, info = get(f"/api/v1/hub/models/{REPO}")
        assert status == 200 and info["format"] == "whisper" and info["refused"] is None
        [opt] = info["options"]
        files = hub.repos[REPO].files
        assert opt["name"] == "ct2" and "README.md" not in opt["files"]
        assert opt["size_bytes"] == sum(len(files[n].data) for n in opt["files"])
        assert opt["fit"] and opt["memory_bytes"] > len(files["model.bin"].data)
        status, err = get("/api/v1/hub/search?format=onnx")
        assert status == 400 and err["error"]["param"] == "format"
        assert "whisper" in err["error"]["message"]
    finally:
        stop_served(s)


def test_a_killed_pull_resumes_and_the_model_transcribes(hub: FakeHub, tmp_path: Path) -> None:
    cut = 1_000_000
    partial = (
        tmp_path / "models" / "Systran" / ".faster-whisper-test.partial" / ".model.bin.partial"
    )
    kill_pull_at(tmp_path, hub, REPO, "model.bin", cut, partial)
    assert ls(tmp_path) == []  # a half folder is not a model

    r = hearth(tmp_path, hub, "pull", REPO, timeout=300)
    assert r.returncode == 0, r.stderr
    assert hub.ranges(REPO, "model.bin") == [None, f"bytes={cut}-"]
    [m] = ls(tmp_path)
    assert m["id"] == r.stdout.strip() and m["format"] == "whisper"
    assert {"transcription", "translation"} <= set(m["capabilities"])
    folder = Path(m["path"])
    served = hub.repos[REPO].files
    assert (folder / "model.bin").read_bytes() == served["model.bin"].data
    assert not (folder / "README.md").exists()
    table = hearth(tmp_path, None, "ls").stdout.splitlines()
    assert next(line for line in table if line.startswith(m["id"])).split()[-1] == "audio"

    clip = speak(tmp_path / "fox.wav")
    t = hearth(tmp_path, None, "transcribe", str(clip), "--model", m["id"], timeout=600)
    assert t.returncode == 0, t.stderr
    assert any(w in t.stdout.lower() for w in FOX_WORDS), t.stdout
