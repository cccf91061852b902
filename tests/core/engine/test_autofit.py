"""Auto-fit context over the real scheduler and estimates, with the fake runtime:
the default context is the largest that fits the budget, up to the trained length and the cap."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import gguf
import numpy as np
import pytest

from app.core.engine.autofit import STEP, choose_context
from app.core.engine.policy import SchedulerPolicy
from app.core.engine.scheduler import ModelScheduler
from app.core.events import EventHub
from app.core.library.index import ModelLibrary
from app.core.service import assemble
from app.core.types import LoadOptions
from app.errors import InsufficientMemory
from app.settings import Settings, settings_from_dict
from tests.support.fakes import FakeRuntime
from tests.support.gguf_files import CHATML, write_model

TRAINED = 131072


def _write_long(path: Path) -> Path:
    """A model trained for 128k tokens whose KV cache is 16 KiB a token (2 GiB at 128k)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("Long Test")
    w.add_context_length(TRAINED)
    w.add_block_count(8)
    w.add_embedding_length(1024)
    w.add_head_count(16)
    w.add_head_count_kv(8)
    w.add_chat_template(CHATML)
    w.add_tensor("tok_embd", np.zeros((16, 64), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture
def long_lib(library: ModelLibrary, tmp_path: Path) -> ModelLibrary:
    library.import_path(_write_long(tmp_path / "src" / "long.gguf"))
    library.import_path(write_model(tmp_path / "src" / "small.gguf"))
    return library


def _ids(lib: ModelLibrary) -> tuple[str, str]:
    by_name = {Path(m.path).name: m.id for m in lib.list()}
    return by_name["long.gguf"], by_name["small.gguf"]


def _sched(lib: ModelLibrary, rt: FakeRuntime, budget: int, cap: int = 32768) -> ModelScheduler:
    return ModelScheduler(
        lib,
        {"gguf": rt},
        EventHub(),
        LoadOptions,  # context 0: auto
        policy=SchedulerPolicy(
            budget_bytes=lambda: budget, auto_context_cap=lambda: cap, sweep_interval=3600
        ),
    )


def _need(s: ModelScheduler, lib: ModelLibrary, mid: str, ctx: int) -> int:
    return s.estimate(lib.get(mid), LoadOptions(context_length=ctx))[1]


async def test_a_model_that_fits_gets_its_trained_length_up_to_the_cap(
    long_lib: ModelLibrary,
) -> None:
    long_id, small_id = _ids(long_lib)
    rt = FakeRuntime(delay=0)
    s = _sched(long_lib, rt, budget=64 * 1024**3, cap=TRAINED * 2)
    try:
        r = await s.load_result(long_id, {})
        assert rt.options[-1].context_length == TRAINED  # what the runtime was given
        assert r.options.context_length == 0  # the model keeps "auto" as its option
        await s.load(small_id)
        assert rt.options[-1].context_length == 2048  # the small one's trained length
    finally:
        await s.close()
    s = _sched(long_lib, rt, budget=64 * 1024**3)  # the default cap, 32k
    try:
        await s.load(long_id)
        assert rt.options[-1].context_length == 32768
        reason = s.fit_context(long_lib.get(long_id), LoadOptions()).reason
        assert "cap" in reason and "32,768" in reason
    finally:
        await s.close()


async def test_a_model_too_large_at_its_trained_length_gets_the_largest_context_that_fits(
    long_lib: ModelLibrary,
) -> None:
    long_id, _ = _ids(long_lib)
    rt = FakeRuntime(delay=0)
    probe = _sched(long_lib, rt, budget=1)
    budget = _need(probe, long_lib, long_id, 20000)  # room for ~20k tokens, not for 32k
    s = _sched(long_lib, rt, budget=budget)
    try:
        await s.load(long_id)
        chosen = rt.options[-1].context_length
        assert chosen % STEP == 0 and 2048 <= chosen < 32768
        # the estimate proves it: the chosen context fits, one step more would not
        assert _need(s, long_lib, long_id, chosen) <= budget
        assert _need(s, long_lib, long_id, chosen + STEP) > budget
        assert s.used() <= budget
        reason = s.fit_context(long_lib.get(long_id), LoadOptions(), replacing=long_id).reason
        assert reason.startswith("auto: the most that fits")
    finally:
        await s.close()


async def test_busy_and_pinned_models_shrink_the_auto_context_idle_ones_are_evicted(
    long_lib: ModelLibrary,
) -> None:
    long_id, small_id = _ids(long_lib)
    rt = FakeRuntime(delay=0)
    probe = _sched(long_lib, rt, budget=1)
    small = _need(probe, long_lib, small_id, 2048)
    budget = _need(probe, long_lib, long_id, 32768) + small // 2  # both do not fit at 32k
    s = _sched(long_lib, rt, budget=budget)
    try:
        await s.load(small_id)  # idle: evicted so that the long model gets its full auto context
        await s.load(long_id)
        assert rt.options[-1].context_length == 32768
        assert [i.model_id for i in s.loaded()] == [long_id]
        await s.unload(long_id)
        await s.load(small_id, pin=True)  # pinned: it stays, and the long one gets less
        await s.load(long_id)
        assert rt.options[-1].context_length < 32768
        assert sorted(i.model_id for i in s.loaded()) == sorted([long_id, small_id])
        assert s.used() <= budget
    finally:
        await s.close()


async def test_an_explicit_context_always_wins_and_auto_loads_do_not_reload(
    long_lib: ModelLibrary,
) -> None:
    long_id, _ = _ids(long_lib)
    rt = FakeRuntime(delay=0)
    probe = _sched(long_lib, rt, budget=1)
    budget = _need(probe, long_lib, long_id, 8192)
    s = _sched(long_lib, rt, budget=budget)
    try:
        with pytest.raises(InsufficientMemory):  # explicit: not shrunk to fit, refused
            await s.load(long_id, {"context_length": 65536})
        await s.load(long_id, {"context_length": 65536}, force=True)
        assert rt.options[-1].context_length == 65536
        await s.unload(long_id)
        first = await s.load_result(long_id, {})
        again = await s.load_result(long_id, {})  # auto again: the loaded copy stays
        assert (first.action, again.action) == ("loaded", "unchanged")
        assert len(rt.options) == 2
        explicit = await s.load_result(long_id, {"context_length": 4096})
        assert explicit.action == "reloaded" and rt.options[-1].context_length == 4096
    finally:
        await s.close()


async def test_the_load_estimate_says_why(long_lib: ModelLibrary) -> None:
    long_id, _ = _ids(long_lib)
    svc = assemble(
        long_lib,
        {"gguf": FakeRuntime(delay=0)},
        load_defaults=LoadOptions,
        budget_bytes=lambda: 64 * 1024**3,
        auto_context_cap=lambda: 16384,
    )
    try:
        est = svc.models.estimate(long_id)
        assert est["context_length"] == 16384 and "cap" in est["context_reason"]
        est = svc.models.estimate(long_id, {"context_length": 3000})
        assert est["context_length"] == 3000 and est["context_reason"].startswith("set explicitly")
    finally:
        await svc.close()


def test_choose_context_floor_when_nothing_fits() -> None:
    def estimate(o: LoadOptions) -> tuple[int, int]:
        n = min(o.context_length, 8192)
        return n, 1000 + n

    low = choose_context(LoadOptions(), estimate=estimate, free_bytes=10)
    assert low.options.context_length == 2048 and "smallest" in low.reason
    exact = choose_context(LoadOptions(), estimate=estimate, free_bytes=1000 + 5000)
    assert exact.options.context_length == 4096  # the largest multiple of 1024 that fits
    top = choose_context(LoadOptions(), estimate=estimate, free_bytes=10**9)
    assert top.options.context_length == 8192 and "trained length" in top.reason


def test_settings_context_auto_round_trips() -> None:
    d = Settings().to_dict()
    assert d["load"]["context_length"] == "auto" and d["load"]["max_auto_context"] == 32768
    assert settings_from_dict(d).load.context_length == 0
    s = settings_from_dict({"load": {"context_length": 8192, "max_auto_context": 65536}})
    assert (s.load.context_length, s.load.max_auto_context) == (8192, 65536)
    assert settings_from_dict(dataclasses.replace(s, load=s.load).to_dict()) == s
    for bad in ({"context_length": "big"}, {"max_auto_context": 100}):
        with pytest.raises(Exception, match="load"):
            settings_from_dict({"load": bad})
