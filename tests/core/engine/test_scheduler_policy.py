"""Scheduler policy over the fake runtime: budget + LRU eviction, TTL, pinning, presets."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from app.core.engine.policy import SchedulerPolicy
from app.core.engine.presets import PresetStore, validate_options
from app.core.engine.scheduler import ModelScheduler, parse_keep_alive
from app.core.events import EventHub
from app.core.library.index import ModelLibrary
from app.core.service import assemble
from app.core.types import LoadOptions
from app.errors import InsufficientMemory, InvalidRequest
from tests.support.fakes import FakeRuntime
from tests.support.gguf_files import CHATML, write_model


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def lib3(library: ModelLibrary, tmp_path: Path) -> ModelLibrary:
    for name in ("a", "b", "c"):
        library.import_path(write_model(tmp_path / "src" / f"{name}.gguf", chat_template=CHATML))
    return library


def _sched(lib: ModelLibrary, rt: FakeRuntime, **kw) -> ModelScheduler:  # type: ignore[no-untyped-def]
    policy = SchedulerPolicy(sweep_interval=3600, **kw)
    return ModelScheduler(lib, {"gguf": rt}, EventHub(), LoadOptions, policy=policy)


@pytest.fixture
async def clock() -> AsyncIterator[Clock]:
    yield Clock()


def _one_model_bytes(lib: ModelLibrary, sched: ModelScheduler) -> int:
    return sched.estimate(lib.get("a"), LoadOptions())[1]


async def test_budget_evicts_least_recently_used_idle_model(
    lib3: ModelLibrary, clock: Clock
) -> None:
    rt = FakeRuntime(delay=0)
    probe = _sched(lib3, rt)
    one = _one_model_bytes(lib3, probe)
    s = _sched(lib3, rt, budget_bytes=lambda: int(2.5 * one), clock=clock)
    try:
        await s.load("a")
        clock.now += 1
        await s.load("b")
        clock.now += 1
        await s.get("a")  # a is now more recent than b
        clock.now += 1
        await s.load("c")
        assert sorted(i.model_id for i in s.loaded()) == ["a", "c"], "b was least recently used"
        assert s.used() <= s.budget()
    finally:
        await s.close()


async def test_refused_with_numbers_unless_forced(lib3: ModelLibrary) -> None:
    rt = FakeRuntime(delay=0)
    one = _one_model_bytes(lib3, _sched(lib3, rt))
    s = _sched(lib3, rt, budget_bytes=lambda: int(1.5 * one))
    try:
        await s.load("a", pin=True)
        with pytest.raises(InsufficientMemory) as ei:
            await s.load("b")
        assert ei.value.needed >= one and ei.value.available < one
        assert "GiB" in ei.value.message or "MiB" in ei.value.message
        assert s.state("b") == "not-loaded" and s.state("a") == "loaded", (
            "a refusal changes nothing"
        )
        await s.load("b", force=True)  # "load anyway"
        assert {i.model_id for i in s.loaded()} == {"a", "b"}
    finally:
        await s.close()


async def test_busy_model_is_not_evicted(lib3: ModelLibrary) -> None:
    rt = FakeRuntime(delay=0)
    one = _one_model_bytes(lib3, _sched(lib3, rt))
    s = _sched(lib3, rt, budget_bytes=lambda: int(1.5 * one))
    try:
        await s.acquire("a")  # a request is using it
        with pytest.raises(InsufficientMemory):
            await s.load("b")
        s.release("a")
        await s.load("b")
        assert [i.model_id for i in s.loaded()] == ["b"]
    finally:
        await s.close()


async def test_ttl_unloads_idle_model_and_pin_keeps_it(lib3: ModelLibrary, clock: Clock) -> None:
    rt = FakeRuntime(delay=0)
    s = _sched(lib3, rt, clock=clock, default_ttl=lambda: 60.0)
    try:
        await s.get("a")  # JIT: the default TTL applies
        await s.load("b")  # explicit: never expires unless asked
        await s.load("c", ttl=10.0, pin=True)
        clock.now += 30
        assert await s.sweep() == []
        clock.now += 31
        assert await s.sweep() == ["a"]
        clock.now += 10_000
        assert await s.sweep() == []
        assert sorted(i.model_id for i in s.loaded()) == ["b", "c"]
        s.set_pinned("c", False)
        assert await s.sweep() == ["c"]
    finally:
        await s.close()


async def test_ttl_zero_unloads_when_idle_and_busy_models_wait(
    lib3: ModelLibrary, clock: Clock
) -> None:
    rt = FakeRuntime(delay=0)
    s = _sched(lib3, rt, clock=clock)
    try:
        await s.acquire("a", ttl=0.0)
        assert await s.sweep() == [], "a model in use is never unloaded"
        s.release("a")
        assert await s.sweep() == ["a"]
    finally:
        await s.close()


async def test_request_ttl_overrides_and_never(lib3: ModelLibrary, clock: Clock) -> None:
    rt = FakeRuntime(delay=0)
    s = _sched(lib3, rt, clock=clock, default_ttl=lambda: 5.0)
    try:
        await s.acquire("a", ttl=None)  # keep_alive -1
        s.release("a")
        clock.now += 10_000
        assert await s.sweep() == []
        info = s.loaded()[0]
        assert info.ttl is None and info.expires_at is None
    finally:
        await s.close()


async def test_background_sweeper_runs(lib3: ModelLibrary) -> None:
    rt = FakeRuntime(delay=0)
    s = ModelScheduler(
        lib3, {"gguf": rt}, EventHub(), LoadOptions, policy=SchedulerPolicy(sweep_interval=0.05)
    )
    try:
        await s.acquire("a", ttl=0.1)
        s.release("a")
        for _ in range(100):
            if s.state("a") == "not-loaded" and rt.models[0].closed:
                break
            await asyncio.sleep(0.05)
        assert s.state("a") == "not-loaded"
        assert rt.models[0].closed
    finally:
        await s.close()


async def test_preset_applies_to_jit_loads(lib3: ModelLibrary, tmp_path: Path) -> None:
    rt = FakeRuntime(delay=0)
    presets = PresetStore(tmp_path / "presets.json")
    presets.set("a", {"context_length": 1234, "kv_type": "q8_0", "ttl": 7, "pinned": True})
    s = ModelScheduler(
        lib3,
        {"gguf": rt},
        EventHub(),
        lambda: LoadOptions(context_length=4096),
        presets=presets,
        policy=SchedulerPolicy(sweep_interval=3600),
    )
    try:
        await s.get("a")  # on demand
        assert rt.options[-1].context_length == 1234 and rt.options[-1].kv_type == "q8_0"
        info = s.loaded()[0]
        assert info.ttl == 7 and info.pinned
        await s.load("b", {"context_length": 512})
        assert rt.options[-1].context_length == 512
    finally:
        await s.close()


def _write_shaped(path: Path) -> Path:
    import gguf
    import numpy as np

    path.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(4096)
    w.add_block_count(4)
    w.add_embedding_length(64)
    w.add_head_count(8)
    w.add_head_count_kv(2)
    w.add_tensor("tok_embd", np.zeros((16, 64), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


async def test_estimate_grows_with_context_and_shrinks_with_kv_type(
    lib3: ModelLibrary, tmp_path: Path
) -> None:
    s = _sched(lib3, FakeRuntime(delay=0))
    m, _ = lib3.import_path(_write_shaped(tmp_path / "src" / "shaped.gguf"))
    # 4 layers x ctx x 2 kv heads x (8 + 8) dims x 2 bytes
    assert s.estimate(m, LoadOptions(context_length=1024))[0].kv_cache == 4 * 1024 * 2 * 16 * 2
    small = s.estimate(m, LoadOptions(context_length=256))[0]
    big = s.estimate(m, LoadOptions(context_length=2048))[0]
    q8 = s.estimate(m, LoadOptions(context_length=2048, kv_type="q8_0"))[0]
    assert big.kv_cache > small.kv_cache > 0
    assert q8.kv_cache < big.kv_cache
    assert big.weights == small.weights > 0


async def test_hearth_estimate_reports_budget(lib3: ModelLibrary) -> None:
    h = assemble(
        lib3, {"gguf": FakeRuntime(delay=0)}, load_defaults=LoadOptions, budget_bytes=lambda: 10**12
    )
    try:
        e = h.models.estimate("a", {"context_length": 512})
        assert e["fits"] is True and e["budget"] == 10**12 and e["total"] > 0
    finally:
        await h.close()


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (300, 300.0),
        ("300", 300.0),
        ("5m", 300.0),
        ("1h30m", 5400.0),
        ("10s", 10.0),
        ("250ms", 0.25),
        (0, 0.0),
        ("0", 0.0),
        (-1, None),
        ("-1", None),
        ("-5m", None),
        (2.5, 2.5),
    ],
)
def test_parse_keep_alive(value: object, seconds: float | None) -> None:
    assert parse_keep_alive(value) == seconds


@pytest.mark.parametrize("value", ["soon", "5 minutes", True, [], {}, "nan", float("inf")])
def test_parse_keep_alive_rejects(value: object) -> None:
    with pytest.raises(InvalidRequest) as ei:
        parse_keep_alive(value)
    assert ei.value.param == "keep_alive"


@pytest.mark.parametrize(
    "bad",
    [
        {"context_length": -1},
        {"kv_type": "q2"},
        {"flash_attention": "yes"},
        {"use_mmap": "no"},
        {"warp": 9},
        {"threads": 1.5},
        {"pinned": "yes"},
        {"ttl": "x"},
    ],
)
def test_bad_options_refused(bad: dict) -> None:
    with pytest.raises(InvalidRequest):
        validate_options(bad)
