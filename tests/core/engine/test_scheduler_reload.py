"""A load with other options than the loaded ones reloads the model ("drift"): over the
fake runtime, with the engine's gate holding a request on the model while the test decides."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from app.core.engine.policy import SchedulerPolicy
from app.core.engine.scheduler import ModelScheduler
from app.core.events import EventHub
from app.core.library.index import ModelLibrary
from app.core.types import GenerationRequest, LoadOptions
from app.errors import InsufficientMemory, ModelBusy
from tests.support.fakes import WAIT_LIMIT, FakeModel, FakeRuntime
from tests.support.gguf_files import CHATML, write_model

LIMIT = 30.0  # generous: liveness, never speed


@pytest.fixture
def lib(library: ModelLibrary, tmp_path: Path) -> ModelLibrary:
    library.import_path(write_model(tmp_path / "src" / "a.gguf", chat_template=CHATML))
    return library


@pytest.fixture
def runtime() -> FakeRuntime:
    return FakeRuntime(delay=0.0)


@pytest.fixture
async def sched(lib: ModelLibrary, runtime: FakeRuntime) -> AsyncIterator[ModelScheduler]:
    s = ModelScheduler(
        lib, {"gguf": runtime}, EventHub(), LoadOptions, policy=SchedulerPolicy(sweep_interval=3600)
    )
    yield s
    await s.close()


async def _hold(lm: FakeModel) -> object:
    """A request running on ``lm`` until the test opens the engine's gate."""
    lm.engine.gate.clear()
    stream = lm.submit(GenerationRequest(prompt_tokens=(1, 2, 3), max_tokens=8, request_id="held"))
    assert await asyncio.to_thread(lm.engine.began.wait, WAIT_LIMIT)
    return stream


async def _drain(stream: object) -> str:
    return "".join([d.text async for d in stream])  # type: ignore[attr-defined]


async def test_load_says_loaded_unchanged_reloaded(
    sched: ModelScheduler, runtime: FakeRuntime
) -> None:
    first = await sched.load_result("a", {})
    assert (first.action, first.options) == ("loaded", LoadOptions())
    again = await sched.load_result("a", {})
    assert again.action == "unchanged" and again.model is first.model and runtime.calls == 1
    new = await sched.load_result("a", {"parallel": 2, "context_length": 1024})
    assert new.action == "reloaded" and runtime.calls == 2
    assert new.model is not first.model and first.model.closed  # type: ignore[attr-defined]
    assert (new.options.parallel, new.options.context_length, new.context_length) == (2, 1024, 1024)
    assert [i.options for i in sched.loaded()] == [new.options]
    # the same options again: nothing to do
    same = await sched.load_result("a", {"parallel": 2, "context_length": 1024})
    assert same.action == "unchanged" and runtime.calls == 2
    # "have it loaded" (a JIT load, a chat that loads first) keeps what is loaded
    assert await sched.load("a") is new.model and runtime.calls == 2
    # options not given resolve as a fresh load would: back to the defaults
    back = await sched.load_result("a", {})
    assert back.action == "reloaded" and back.options == LoadOptions() and runtime.calls == 3


async def test_reload_keeps_ttl_and_pin(sched: ModelScheduler) -> None:
    await sched.load("a", {}, ttl=120.0, pin=True)
    await sched.load("a", {"context_length": 512})
    (info,) = sched.loaded()
    assert (info.context_length, info.ttl, info.pinned) == (512, 120.0, True)


async def test_reload_while_a_request_runs_is_refused_and_the_request_finishes(
    sched: ModelScheduler, runtime: FakeRuntime
) -> None:
    lm = await sched.load("a", {})
    stream = await _hold(lm)  # type: ignore[arg-type]
    with pytest.raises(ModelBusy) as ei:
        await sched.load("a", {"context_length": 512})
    assert (ei.value.status, ei.value.code, ei.value.pending) == (409, "model_busy", 1)
    assert "wait" in ei.value.message
    # nothing changed: same model, same options, the request goes on to its end
    assert sched.loaded_model("a") is lm and runtime.calls == 1
    assert sched.loaded()[0].reload_pending is False
    # the same options as loaded are no reload: fine while busy
    assert (await sched.load_result("a", {})).action == "unchanged"
    lm.engine.gate.set()  # type: ignore[attr-defined]
    assert await asyncio.wait_for(_drain(stream), LIMIT) == "Hello, world"
    assert not lm.closed  # type: ignore[attr-defined]


async def test_reload_with_wait_waits_for_the_running_request_and_holds_new_ones(
    sched: ModelScheduler, runtime: FakeRuntime
) -> None:
    lm = await sched.load("a", {})
    stream = await _hold(lm)  # type: ignore[arg-type]
    reload = asyncio.ensure_future(sched.load_result("a", {"context_length": 512}, wait=True))
    while not sched.loaded()[0].reload_pending:  # the gate: ps says it waits
        await asyncio.sleep(0.01)
    # a request that comes now waits for the reload instead of keeping the model busy
    newcomer = asyncio.ensure_future(sched.acquire("a"))
    await asyncio.sleep(0.2)  # a chance to go wrong; the assertions hold at any speed
    assert not reload.done() and not newcomer.done()
    assert sched.loaded_model("a") is lm and runtime.calls == 1
    lm.engine.gate.set()  # type: ignore[attr-defined]
    # the running request was not cut by the reload
    assert await asyncio.wait_for(_drain(stream), LIMIT) == "Hello, world"
    result = await asyncio.wait_for(reload, LIMIT)
    assert result.action == "reloaded" and result.context_length == 512 and runtime.calls == 2
    got = await asyncio.wait_for(newcomer, LIMIT)
    assert got is result.model  # the newcomer runs on the reloaded model
    sched.release("a")
    assert sched.loaded()[0].reload_pending is False


async def test_a_reload_that_does_not_fit_keeps_the_loaded_model(
    lib: ModelLibrary, runtime: FakeRuntime
) -> None:
    probe = ModelScheduler(lib, {"gguf": runtime}, EventHub(), LoadOptions)
    small = probe.estimate(lib.get("a"), LoadOptions(context_length=512))[1]
    big = probe.estimate(lib.get("a"), LoadOptions(context_length=2048, parallel=16))[1]
    assert big > small + 2**20
    budget = (small + big) // 2  # holds one small copy, never the big one
    policy = SchedulerPolicy(budget_bytes=lambda: budget)
    s = ModelScheduler(lib, {"gguf": runtime}, EventHub(), LoadOptions, policy=policy)
    try:
        lm = await s.load("a", {"context_length": 512})
        with pytest.raises(InsufficientMemory):
            await s.load("a", {"context_length": 2048, "parallel": 16})
        assert s.loaded_model("a") is lm and not lm.closed  # type: ignore[attr-defined]
        # the old copy's memory counts as free: a reload to the same size fits
        assert (await s.load_result("a", {"context_length": 512, "threads": 2})).action == (
            "reloaded"
        )
    finally:
        await s.close()


async def test_a_reload_waiting_caller_that_goes_away_leaves_nothing_held(
    sched: ModelScheduler,
) -> None:
    lm = await sched.load("a", {})
    stream = await _hold(lm)  # type: ignore[arg-type]
    reload = asyncio.ensure_future(sched.load("a", {"context_length": 512}, wait=True))
    while not sched.loaded()[0].reload_pending:
        await asyncio.sleep(0.01)
    reload.cancel()  # the client disconnected
    with pytest.raises(asyncio.CancelledError):
        await reload
    assert sched.loaded()[0].reload_pending is False
    assert await asyncio.wait_for(sched.get("a"), LIMIT) is lm  # requests are not held any more
    lm.engine.gate.set()  # type: ignore[attr-defined]
    await asyncio.wait_for(_drain(stream), LIMIT)
