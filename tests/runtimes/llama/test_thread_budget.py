"""Several llama.cpp contexts in one process: with OpenMP (pip's source builds on Linux) the
threads of all of them count together, and once they outnumber the CPUs every barrier sleeps
(a first model decoded at half speed after a second one had run). "auto" threads keep the sum
within the CPUs; a set thread count is kept as given."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from app.core.library.index import ModelLibrary
from app.core.service import assemble
from app.core.types import LoadOptions
from app.runtimes.llama import backend as B
from app.runtimes.llama.runtime import LlamaCppRuntime
from tests.support import probes

needs_openmp = pytest.mark.skipif(
    not B.openmp_build(), reason="llama.cpp here is built without OpenMP: no shared budget"
)


@pytest.fixture
def two_cpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0, 1})


@needs_openmp
def test_auto_threads_stay_within_the_cpus(two_cpus: None) -> None:
    if B.physical_cores() < 2:
        pytest.skip("one physical core: every model gets 1 thread anyway")
    try:
        assert B.claim_threads(1, 0, generates=True) == 2  # the first: all
        assert B.claim_threads(2, 0, generates=True) == 1  # what is left
        assert B.claim_threads(3, 2, generates=True) == 2  # set: as given
        B.release_threads(1)
        B.release_threads(3)
        assert B.claim_threads(4, 0, generates=True) == 2  # room again
    finally:
        for k in (1, 2, 3, 4):
            B.release_threads(k)


@needs_openmp
def test_an_embedding_model_leaves_a_chat_models_threads(two_cpus: None) -> None:
    if B.physical_cores() < 2:
        pytest.skip("one physical core: every model gets 1 thread anyway")
    try:
        assert B.claim_threads(1, 0, generates=False) == 1  # no chat model yet: its room stays
        assert B.claim_threads(2, 0, generates=True) == 2
    finally:
        B.release_threads(1)
        B.release_threads(2)


@needs_openmp
@pytest.mark.model
async def test_a_second_loaded_model_takes_the_threads_left(
    tmp_path: Path, smollm2_path: Path, two_cpus: None
) -> None:
    """Two chat models loaded at once on 2 CPUs: the second decodes with 1 thread (its tuner
    never goes above it); once the first is unloaded a new load gets both again."""
    if B.physical_cores() < 2:
        pytest.skip("one physical core: every model gets 1 thread anyway")
    lib = ModelLibrary(tmp_path / "library.json", tmp_path / "models")
    h = assemble(
        lib,
        {"gguf": LlamaCppRuntime(probe_file=probes.shared())},
        load_defaults=lambda: LoadOptions(context_length=512),
    )
    first, _ = h.models.import_path(smollm2_path)
    copy = tmp_path / "Second-Copy.Q4_1.gguf"  # another model in the library, same weights
    try:
        os.link(smollm2_path, copy)
    except OSError:  # another file system
        copy.write_bytes(smollm2_path.read_bytes())
    second, _ = h.models.import_path(copy)
    assert second.id != first.id
    try:
        a = (await h.models.load(first.id)).engine  # type: ignore[attr-defined]
        assert a.threads == 2
        b = (await h.models.load(second.id)).engine  # type: ignore[attr-defined]
        assert b.threads == 1 and (b.tuner is None or b.tuner.max_threads == 1)
        await h.models.unload(first.id)
        await h.models.unload(second.id)
        c = (await h.models.load(second.id)).engine  # type: ignore[attr-defined]
        assert c.threads == 2
    finally:
        await h.close()
