"""A loaded model's FIM tokens: named by the GGUF's keys, or found by the texts the code-model
families use (what llama.cpp did not recognise is looked up by the core); none on a model
without prefix, suffix and middle markers, which is a 400 naming the wire's field."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from app.core.inference.fim import FimTokens, find_fim_tokens, require_fim
from app.core.types import LoadOptions, LocalModel
from app.errors import InvalidRequest
from app.runtimes.llama.runtime import LlamaCppRuntime
from tests.support import probes

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def load(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    rt = LlamaCppRuntime(probe_file=probes.shared())
    loaded: list[object] = []

    def _load(path: Path, **extra: object) -> object:
        m = LocalModel(
            id=path.stem, path=str(path), format="gguf", size_bytes=1, owned=False, extra=extra
        )
        lm = rt.load(m, LoadOptions(context_length=512))
        loaded.append(lm)
        return lm

    yield _load
    for lm in loaded:
        lm.close()  # type: ignore[attr-defined]
    rt.close()


def test_the_gguf_keys_name_the_tokens(load: object, fim_gguf: Path) -> None:
    lm = load(fim_gguf)  # type: ignore[operator]
    assert find_fim_tokens(lm) == FimTokens(pre=7, suf=8, mid=9, pad=16, rep=3, sep=5)


def test_the_texts_name_them_without_keys(load: object, fim_texts_gguf: Path) -> None:
    lm = load(fim_texts_gguf)  # type: ignore[operator]
    # llama.cpp knows <fim_prefix>..., <reponame>; StarCoder2's <file_sep> is the core's
    assert lm.special_tokens["fim_sep_id"] is None
    assert find_fim_tokens(lm) == FimTokens(pre=7, suf=8, mid=9, pad=16, rep=4, sep=5)


def test_a_model_without_markers_cannot_fill(
    load: object, smollm2_path: Path, embedding_gguf: Path
) -> None:
    plain = load(smollm2_path)  # type: ignore[operator]
    assert find_fim_tokens(plain) is None
    with pytest.raises(InvalidRequest) as e:
        require_fim(plain, "plain", "input_suffix")
    assert e.value.param == "input_suffix" and "fill-in-the-middle" in e.value.message
    with pytest.raises(InvalidRequest) as e:
        require_fim(load(embedding_gguf, embedding=True), "emb", "suffix")  # type: ignore[operator]
    assert e.value.param == "suffix" and "embedding" in e.value.message


class _Counting:
    """The real loaded model, counting its tokenize calls."""

    def __init__(self, lm: object) -> None:
        self._lm, self.tokenized = lm, 0

    def tokenize(self, *args: object, **kw: object) -> list[int]:
        self.tokenized += 1
        return self._lm.tokenize(*args, **kw)  # type: ignore[attr-defined,no-any-return]

    def __getattr__(self, name: str) -> object:
        return getattr(self._lm, name)


def test_the_tokens_are_looked_up_once_per_loaded_model(load: object, fim_texts_gguf: Path) -> None:
    """An editor asks per keystroke: the lookup by text tokenizes only the first time."""
    lm = _Counting(load(fim_texts_gguf))  # type: ignore[operator]
    first = find_fim_tokens(lm)  # type: ignore[arg-type]
    assert first is not None and lm.tokenized > 0
    lm.tokenized = 0
    assert find_fim_tokens(lm) == first  # type: ignore[arg-type]
    assert lm.tokenized == 0
