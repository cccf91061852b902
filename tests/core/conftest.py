"""Fixtures for tests/core: real files under tmp_path, never the user's Hearth folders."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from app.core.library.index import ModelLibrary
from tests.support.gguf_files import write_model

TESTDATA = Path(__file__).resolve().parents[2].parent / "shared" / "testdata"


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Nothing in these tests may touch the real per-user folders.
    monkeypatch.setenv("HEARTH_HOME", str(tmp_path / "hearth-home"))


@pytest.fixture
def models_dir(tmp_path: Path) -> Path:
    return tmp_path / "models"


@pytest.fixture
def index_file(tmp_path: Path) -> Path:
    return tmp_path / "data" / "library.json"


@pytest.fixture
def library(index_file: Path, models_dir: Path) -> ModelLibrary:
    return ModelLibrary(index_file, models_dir)


@pytest.fixture
def make_gguf(tmp_path: Path) -> Callable[..., Path]:
    """``make_gguf("elsewhere/x.gguf", **write_model options)`` -> a valid GGUF under tmp_path."""

    def make(rel: str = "src/tiny-model.gguf", **kw: Any) -> Path:
        return write_model(tmp_path / rel, **kw)

    return make


@pytest.fixture
def minilm() -> Path:
    p = TESTDATA / "all-minilm-l6-v2-q8_0.gguf"
    if not p.is_file():
        pytest.skip(f"real test model missing: {p} (the shared testdata folder is not mounted)")
    return p
