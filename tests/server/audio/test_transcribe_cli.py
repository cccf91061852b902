"""`hearth transcribe FILE` as a real process on the real Whisper model: the transcript in each
format, translation, the model found when the library has one, exit code 2 for a bad argument
and 1 (with the extra to install) where faster-whisper is missing."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.support.hearthproc import env_for, hearth
from tests.support.speech import FOX_WORDS, speak, whisper_or_skip

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    """(home with the Whisper model imported, a spoken clip, the model's id)."""
    whisper = whisper_or_skip()
    home = tmp_path_factory.mktemp("transcribe-cli")
    clip = speak(home / "fox.wav")
    r = hearth(home / "h", None, "import", str(whisper))
    assert r.returncode == 0, r.stderr
    return home / "h", clip, r.stdout.strip()


def test_text_by_default_with_the_only_speech_model(setup: tuple[Path, Path, str]) -> None:
    home, clip, _ = setup
    r = hearth(home, None, "transcribe", str(clip), timeout=300)
    assert r.returncode == 0, r.stderr
    assert all(w in r.stdout.lower() for w in FOX_WORDS), r.stdout


def test_verbose_json_and_srt(setup: tuple[Path, Path, str]) -> None:
    home, clip, wid = setup
    r = hearth(home, None, "transcribe", str(clip), "--model", wid, "--format", "verbose_json")
    assert r.returncode == 0, r.stderr
    body = json.loads(r.stdout)
    assert body["language"] == "english" and body["segments"]
    r = hearth(home, None, "transcribe", str(clip), "--format", "srt", "--language", "en")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("1\n00:00:00,000 --> ")


def test_translate(setup: tuple[Path, Path, str]) -> None:
    home, clip, _ = setup
    r = hearth(home, None, "transcribe", str(clip), "--translate", "--format", "verbose_json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["task"] == "translate"


def test_bad_arguments_exit_2(setup: tuple[Path, Path, str]) -> None:
    home, clip, _ = setup
    r = hearth(home, None, "transcribe", str(clip.parent / "missing.wav"))
    assert r.returncode == 2 and "no such file" in r.stderr
    r = hearth(home, None, "transcribe", str(clip), "--format", "mp3")
    assert r.returncode == 2


def test_a_failure_exits_1(setup: tuple[Path, Path, str]) -> None:
    home, clip, wid = setup
    noise = clip.parent / "noise.wav"
    noise.write_bytes(b"not audio at all" * 100)
    r = hearth(home, None, "transcribe", str(noise), "--model", wid)
    assert r.returncode == 1 and "not audio Hearth can read" in r.stderr


def test_without_faster_whisper_it_says_to_install_the_speech_extra(
    setup: tuple[Path, Path, str],
) -> None:
    import subprocess

    home, clip, wid = setup
    # the third-party packages absent (an import of them fails), Hearth itself untouched
    code = (
        "import sys; sys.modules['faster_whisper'] = None; sys.modules['av'] = None; "
        "from app.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    r = subprocess.run(
        [sys.executable, "-c", code, "transcribe", str(clip), "--model", wid],
        capture_output=True,
        text=True,
        env=env_for(home, None),
        timeout=120,
    )
    assert r.returncode == 1, r.stderr
    assert "install the speech extra" in r.stderr and "Traceback" not in r.stderr
