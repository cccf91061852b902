"""A real server with a FIM model (SmolLM2 whose keys name FIM tokens, the default model), the
same model known by its token texts, plain SmolLM2 (no FIM tokens) and an embedding model."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from app.settings import SettingsStore
from tests.conftest import Served, serving


@dataclass
class Fim:
    s: Served
    keys: str  # the FIM model's id (its GGUF keys name the tokens)
    texts: str  # found by its token texts
    plain: str  # SmolLM2 as it is: no FIM tokens
    embed: str

    @property
    def root(self) -> str:
        return self.s.root


@pytest.fixture(scope="package")
def fim(
    tmp_path_factory: pytest.TempPathFactory,
    fim_gguf: Path,
    fim_texts_gguf: Path,
    smollm2_path: Path,
    embedding_gguf: Path,
) -> Iterator[Fim]:
    home = tmp_path_factory.mktemp("fim")
    with serving(home, fim_gguf, fim_texts_gguf, smollm2_path, embedding_gguf) as s:
        statuses = s.service.models.all()  # type: ignore[attr-defined]
        ids = {str(Path(m.model.path).resolve()): m.model.id for m in statuses}
        SettingsStore(home / "config" / "settings.json").update(default_model=s.model_id)
        yield Fim(
            s,
            keys=s.model_id,
            texts=ids[str(fim_texts_gguf.resolve())],
            plain=ids[str(smollm2_path.resolve())],
            embed=ids[str(embedding_gguf.resolve())],
        )
