"""ModelScheduler and the Hearth façade over a fake runtime (a real Worker over a scripted engine)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from app.core.engine.scheduler import ModelScheduler
from app.core.events import (
    Event,
    EventHub,
    LibraryChanged,
    ModelLoaded,
    ModelLoadFailed,
    ModelUnloaded,
)
from app.core.inference.chat_template import FALLBACK_STOPS
from app.core.library.index import ModelLibrary
from app.core.service import Hearth, assemble
from app.core.types import ChatMessage, GenerationRequest, LoadOptions, SamplingParams
from app.errors import (
    ContextLengthExceeded,
    InvalidModel,
    InvalidRequest,
    ModelNotFound,
    QueueFull,
    RuntimeUnavailable,
)
from app.errors import (
    ModelLoadFailed as LoadFailedError,
)
from tests.support.fakes import FakeModel, FakeRuntime
from tests.support.gguf_files import CHATML, write_model
from tests.support.service_calls import chat, complete

BOS_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{% endfor %}"
)
SAMPLING = SamplingParams(temperature=0.0)


@pytest.fixture
def lib(library: ModelLibrary, tmp_path: Path) -> ModelLibrary:
    library.import_path(write_model(tmp_path / "src" / "alpha.gguf", chat_template=CHATML))
    library.import_path(write_model(tmp_path / "src" / "base.gguf", chat_template=None))
    library.import_path(write_model(tmp_path / "src" / "bosmodel.gguf", chat_template=BOS_TEMPLATE))
    return library


@pytest.fixture
def events() -> tuple[EventHub, list[Event]]:
    hub = EventHub()
    seen: list[Event] = []
    hub.subscribe(seen.append)
    return hub, seen


@pytest.fixture
def runtime() -> FakeRuntime:
    return FakeRuntime()


@pytest.fixture
async def sched(
    lib: ModelLibrary, events: tuple[EventHub, list[Event]], runtime: FakeRuntime
) -> AsyncIterator[ModelScheduler]:
    s = ModelScheduler(lib, {"gguf": runtime}, events[0], LoadOptions)
    yield s
    await s.close()


def _kinds(seen: list[Event]) -> list[tuple[str, str]]:
    return [(type(e).__name__, getattr(e, "model_id", "")) for e in seen]


# -- scheduler ---------------------------------------------------------------------------------------


async def test_concurrent_gets_share_one_load(
    runtime: FakeRuntime, sched: ModelScheduler, events: tuple[EventHub, list[Event]]
) -> None:
    runtime.load_gate.clear()
    tasks = [asyncio.create_task(sched.get("alpha")) for _ in range(20)]
    await asyncio.sleep(0.05)
    assert sched.state("alpha") == "loading"
    assert sched.loading() == ["alpha"]
    runtime.load_gate.set()
    results = await asyncio.gather(*tasks)
    assert runtime.calls == 1
    assert all(r is results[0] for r in results)
    assert sched.state("alpha") == "loaded"
    assert sched.loading() == []
    assert [i.model_id for i in sched.loaded()] == ["alpha"]
    assert sched.loaded_model("alpha") is results[0]
    # already loaded: no more loads
    assert await sched.get("alpha") is results[0]
    assert await sched.load("alpha") is results[0]
    assert runtime.calls == 1
    assert _kinds(events[1]) == [("ModelLoading", "alpha"), ("ModelLoaded", "alpha")]
    loaded = events[1][1]
    assert isinstance(loaded, ModelLoaded) and loaded.context_length == 2048
    assert loaded.load_seconds >= 0.15


async def test_two_models_load_independently(runtime: FakeRuntime, sched: ModelScheduler) -> None:
    a, b = await asyncio.gather(sched.get("alpha"), sched.get("base"))
    assert a is not b
    assert runtime.calls == 2
    assert {i.model_id for i in sched.loaded()} == {"alpha", "base"}


async def test_failed_load_raises_to_every_waiter_and_can_be_retried(
    lib: ModelLibrary, events: tuple[EventHub, list[Event]]
) -> None:
    runtime = FakeRuntime(fail_times=1)
    s = ModelScheduler(lib, {"gguf": runtime}, events[0], LoadOptions)
    try:
        results = await asyncio.gather(*(s.get("alpha") for _ in range(20)), return_exceptions=True)
        assert runtime.calls == 1
        assert all(isinstance(r, LoadFailedError) for r in results), results
        assert "alpha" in results[0].message  # type: ignore[union-attr]
        assert s.state("alpha") == "not-loaded"
        assert s.loaded() == [] and s.loading() == []
        failed = [e for e in events[1] if isinstance(e, ModelLoadFailed)]
        assert len(failed) == 1 and failed[0].model_id == "alpha" and failed[0].message
        # the next try loads
        lm = await s.get("alpha")
        assert runtime.calls == 2
        assert s.state("alpha") == "loaded"
        assert isinstance(lm, FakeModel)
        assert _kinds(events[1]) == [
            ("ModelLoading", "alpha"),
            ("ModelLoadFailed", "alpha"),
            ("ModelLoading", "alpha"),
            ("ModelLoaded", "alpha"),
        ]
    finally:
        await s.close()


async def test_hearth_errors_from_the_runtime_pass_through(lib: ModelLibrary) -> None:
    runtime = FakeRuntime(fail_times=1, error=InvalidModel("bad tensor data"), delay=0.0)
    s = ModelScheduler(lib, {"gguf": runtime}, EventHub(), LoadOptions)
    with pytest.raises(InvalidModel, match="bad tensor data"):
        await s.load("alpha")
    await s.close()


async def test_unknown_model(runtime: FakeRuntime, sched: ModelScheduler) -> None:
    for call in (sched.get("nope"), sched.load("nope"), sched.get("nope", load=False)):
        with pytest.raises(ModelNotFound, match="does not exist"):
            await call
    assert runtime.calls == 0
    assert sched.state("nope") == "not-loaded"
    assert await sched.unload("nope") is False


async def test_jit_off(runtime: FakeRuntime, sched: ModelScheduler) -> None:
    with pytest.raises(ModelNotFound, match="not loaded"):
        await sched.get("alpha", load=False)
    assert runtime.calls == 0
    assert sched.state("alpha") == "not-loaded"
    lm = await sched.load("alpha")
    assert await sched.get("alpha", load=False) is lm


async def test_unload(
    runtime: FakeRuntime, sched: ModelScheduler, events: tuple[EventHub, list[Event]]
) -> None:
    lm = await sched.get("alpha")
    assert isinstance(lm, FakeModel)
    assert await sched.unload("alpha") is True
    assert sched.state("alpha") == "not-loaded"
    assert sched.loaded() == []
    assert lm.closed
    assert lm.engine.shut_down.is_set()
    assert not lm.worker._thread.is_alive()
    assert isinstance(events[1][-1], ModelUnloaded)
    assert await sched.unload("alpha") is False
    # loads again on demand
    assert await sched.get("alpha") is not lm
    assert runtime.calls == 2


async def test_unload_during_a_load_waits_for_it(
    runtime: FakeRuntime, sched: ModelScheduler
) -> None:
    runtime.load_gate.clear()
    task = asyncio.create_task(sched.load("alpha"))
    await asyncio.sleep(0.05)
    unload = asyncio.create_task(sched.unload("alpha"))
    await asyncio.sleep(0.05)
    assert not unload.done()  # it waits for the load
    runtime.load_gate.set()
    assert await unload is True
    lm = await task
    assert isinstance(lm, FakeModel) and lm.closed
    assert sched.state("alpha") == "not-loaded"


async def test_a_cancelled_waiter_does_not_cancel_the_load(
    runtime: FakeRuntime, sched: ModelScheduler
) -> None:
    runtime.load_gate.clear()
    first = asyncio.create_task(sched.get("alpha"))
    second = asyncio.create_task(sched.get("alpha"))
    await asyncio.sleep(0.05)
    first.cancel()
    await asyncio.sleep(0)
    runtime.load_gate.set()
    lm = await second
    assert first.cancelled()
    assert runtime.calls == 1
    assert sched.loaded_model("alpha") is lm


async def test_options_reach_the_runtime(runtime: FakeRuntime, sched: ModelScheduler) -> None:
    lm = await sched.load("alpha", LoadOptions(context_length=512, threads=3))
    assert lm.context_length == 512
    assert runtime.options[-1].threads == 3
    await sched.unload("alpha")
    await sched.load("alpha")  # defaults from the load_defaults callable
    # context 0 is auto: the runtime gets the model's trained length; the model keeps "auto"
    assert runtime.options[-1] == LoadOptions(context_length=2048)
    assert sched.loaded()[0].options == LoadOptions()


async def test_no_runtime_for_the_format(lib: ModelLibrary) -> None:
    for runtimes in ({}, {"gguf": FakeRuntime(is_available=False)}):
        s = ModelScheduler(lib, runtimes, EventHub(), LoadOptions)  # type: ignore[arg-type]
        with pytest.raises(RuntimeUnavailable):
            await s.get("alpha")
        assert s.state("alpha") == "not-loaded"


async def test_unload_cancels_running_and_queued_requests(sched: ModelScheduler) -> None:
    lm = await sched.load("alpha")
    assert isinstance(lm, FakeModel)
    lm.engine.gate.clear()  # the first request sits in prompt processing
    running = lm.submit(GenerationRequest(prompt_tokens=(5,), max_tokens=4, request_id="r1"))
    queued = lm.submit(GenerationRequest(prompt_tokens=(5,), max_tokens=4, request_id="r2"))
    await asyncio.to_thread(lm.engine.began.wait, 5)
    assert await sched.unload("alpha") is True
    for stream in (running, queued):
        deltas = [d async for d in stream]
        assert deltas[-1].finish_reason == "cancelled"
        assert "".join(d.text for d in deltas) == ""
    assert lm.engine.begun == ["r1"]  # the queued one never ran


# -- Hearth ----------------------------------------------------------------------------------------


@pytest.fixture
async def hearth(lib: ModelLibrary) -> AsyncIterator[Hearth]:
    h = assemble(
        lib, {"gguf": FakeRuntime(delay=0.0)}, load_defaults=lambda: LoadOptions(context_length=256)
    )
    yield h
    await h.close()


async def _fake(h: Hearth, model_id: str) -> FakeModel:
    lm = h.models._scheduler.loaded_model(model_id)
    assert isinstance(lm, FakeModel)
    return lm


async def test_chat_renders_tokenizes_and_streams(hearth: Hearth) -> None:
    gen = await chat(
        hearth,
        "alpha",
        [ChatMessage("user", "hi")],
        sampling=SAMPLING,
        max_tokens=10,
        stop=["zzz"],
        request_id="req-1",
    )
    _c = await gen.collect()
    text, final = _c.text, _c.final
    assert text == "Hello, world"
    assert final.finish_reason == "stop"
    lm = await _fake(hearth, "alpha")
    req = lm.submitted[0]
    prompt = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert req.prompt_tokens == tuple([1] + [10 + ord(c) for c in prompt])
    assert gen.prompt_tokens == len(req.prompt_tokens)
    assert final.usage is not None and final.usage.prompt_tokens == gen.prompt_tokens
    assert final.usage.completion_tokens == 3
    assert req.stop == ("zzz",)  # the model has a template: no fallback stops
    assert req.request_id == "req-1" and req.sampling == SAMPLING and req.max_tokens == 10


async def test_chat_without_template_uses_fallback_and_its_stops(lib: ModelLibrary) -> None:
    runtime = FakeRuntime(delay=0.0, pieces=("Sure.", "\nUser:", " and more"))
    h = assemble(lib, {"gguf": runtime}, load_defaults=lambda: LoadOptions(context_length=256))
    try:
        gen = await chat(h, "base", [ChatMessage("user", "hi")], sampling=SAMPLING, max_tokens=None)
        _c = await gen.collect()
        text, final = _c.text, _c.final
        assert text == "Sure."
        assert final.finish_reason == "stop"
        req = (await _fake(h, "base")).submitted[0]
        assert set(FALLBACK_STOPS) <= set(req.stop)
        prompt = "User: hi\nAssistant:"
        assert req.prompt_tokens == tuple([1] + [10 + ord(c) for c in prompt])
    finally:
        await h.close()


async def test_chat_drops_a_doubled_bos(hearth: Hearth) -> None:
    gen = await chat(
        hearth, "bosmodel", [ChatMessage("user", "x")], sampling=SAMPLING, max_tokens=2
    )
    await gen.collect()
    req = (await _fake(hearth, "bosmodel")).submitted[0]
    # template wrote <s>, the tokenizer added BOS too: exactly one remains
    assert req.prompt_tokens == tuple([1] + [10 + ord(c) for c in "[user]x"])


async def test_context_overflow_is_refused_before_submitting(hearth: Hearth) -> None:
    await hearth.models.load("alpha", LoadOptions(context_length=64))
    lm = await _fake(hearth, "alpha")
    with pytest.raises(ContextLengthExceeded) as ei:
        await chat(
            hearth, "alpha", [ChatMessage("user", "x" * 100)], sampling=SAMPLING, max_tokens=5
        )
    assert ei.value.param == "messages" and ei.value.status == 400
    assert "64" in ei.value.message
    with pytest.raises(ContextLengthExceeded) as ei2:
        await complete(hearth, "alpha", "y" * 80, sampling=SAMPLING, max_tokens=5)
    assert ei2.value.param == "prompt"
    assert lm.submit_calls == 0 and lm.pending == 0
    assert lm.engine.begun == []


async def test_context_boundary(hearth: Hearth) -> None:
    await hearth.models.load("alpha", LoadOptions(context_length=16))
    lm = await _fake(hearth, "alpha")
    with pytest.raises(ContextLengthExceeded):  # a full context leaves no room to generate
        await complete(hearth, "alpha", [5] * 16, sampling=SAMPLING, max_tokens=1)
    gen = await complete(hearth, "alpha", [5] * 15, sampling=SAMPLING, max_tokens=1)
    _c = await gen.collect()
    text, final = _c.text, _c.final
    assert (text, final.finish_reason) == ("Hello", "length")
    assert final.usage is not None and final.usage.prompt_tokens == 15
    assert lm.submit_calls == 1


async def test_empty_prompt_is_an_invalid_request(lib: ModelLibrary) -> None:
    h = assemble(lib, {"gguf": FakeRuntime(delay=0.0, add_bos=False)}, load_defaults=LoadOptions)
    try:
        prompts: list[str | list[int]] = ["", []]
        for prompt in prompts:
            with pytest.raises(InvalidRequest, match="empty") as ei:
                await complete(h, "alpha", prompt, sampling=SAMPLING, max_tokens=5)
            assert ei.value.param == "prompt"
            assert not isinstance(ei.value, ContextLengthExceeded)
        assert (await _fake(h, "alpha")).submit_calls == 0
    finally:
        await h.close()


async def test_token_ids_out_of_vocabulary(hearth: Hearth) -> None:
    for bad in ([5, -1], [5, 70_000]):
        with pytest.raises(InvalidRequest, match="token ids"):
            await complete(hearth, "alpha", bad, sampling=SAMPLING, max_tokens=1)
    assert (await _fake(hearth, "alpha")).submit_calls == 0


async def test_queue_full(lib: ModelLibrary) -> None:
    runtime = FakeRuntime(delay=0.0, queue_size=1)
    h = assemble(lib, {"gguf": runtime}, load_defaults=LoadOptions)
    try:
        lm = await h.models.load("alpha")
        assert isinstance(lm, FakeModel)
        lm.engine.gate.clear()  # the engine blocks in prompt processing until released
        first = await complete(h, "alpha", "one", sampling=SAMPLING, max_tokens=3, request_id="a")
        assert await asyncio.to_thread(lm.engine.began.wait, 5)
        second = await complete(h, "alpha", "two", sampling=SAMPLING, max_tokens=3, request_id="b")
        assert lm.pending == 2
        with pytest.raises(QueueFull) as ei:
            await complete(h, "alpha", "three", sampling=SAMPLING, max_tokens=3, request_id="c")
        assert ei.value.status == 429 and ei.value.retry_after >= 1
        lm.engine.gate.set()
        # the requests already in are not cut to make room
        assert (await first.collect()).text == "Hello, world"
        assert (await second.collect()).text == "Hello, world"
        assert lm.engine.begun == ["a", "b"]
        # room again
        third = await complete(h, "alpha", "three", sampling=SAMPLING, max_tokens=1)
        assert (await third.collect()).final.finish_reason == "length"
    finally:
        await h.close()


async def test_jit_disabled_in_hearth(lib: ModelLibrary) -> None:
    runtime = FakeRuntime(delay=0.0)
    h = assemble(lib, {"gguf": runtime}, load_defaults=LoadOptions, jit_enabled=lambda: False)
    try:
        with pytest.raises(ModelNotFound):
            await chat(h, "alpha", [ChatMessage("user", "hi")], sampling=SAMPLING, max_tokens=1)
        with pytest.raises(ModelNotFound):
            await complete(h, "nope", "x", sampling=SAMPLING, max_tokens=1)
        assert runtime.calls == 0
        await h.models.load("alpha")
        gen = await complete(h, "alpha", "x", sampling=SAMPLING, max_tokens=1)
        assert (await gen.collect()).text == "Hello"
    finally:
        await h.close()


async def test_cancelling_a_generation(lib: ModelLibrary) -> None:
    runtime = FakeRuntime(delay=0.0, pieces=None)  # generates forever
    h = assemble(lib, {"gguf": runtime}, load_defaults=LoadOptions)
    try:
        gen = await complete(h, "alpha", "go", sampling=SAMPLING, max_tokens=None)
        got = []
        async for d in gen:
            got.append(d)
            if len(got) == 3:
                gen.cancel()
            if d.finish_reason:
                break
        assert got[-1].finish_reason == "cancelled"
        lm = await _fake(h, "alpha")
        for _ in range(500):  # the worker forgets a sequence just after its final delta
            if lm.pending == 0:
                break
            await asyncio.sleep(0.01)
        assert lm.pending == 0
    finally:
        await h.close()


async def test_models_status_and_remove(hearth: Hearth, lib: ModelLibrary) -> None:
    seen: list[Event] = []
    hearth.events.subscribe(seen.append)
    await hearth.models.load("alpha", LoadOptions(context_length=128))
    status = {s.model.id: s for s in hearth.models.all()}
    assert status["alpha"].state == "loaded"
    assert status["alpha"].context_length == 128 and status["alpha"].runtime == "fake"
    assert status["base"].state == "not-loaded" and status["base"].context_length is None
    d = hearth.models.status("alpha").as_dict()
    assert d["state"] == "loaded" and d["loaded_context_length"] == 128 and d["id"] == "alpha"
    lm = await _fake(hearth, "alpha")
    model, deleted = await hearth.models.remove("alpha")
    assert model.id == "alpha" and deleted is False
    assert lm.closed  # unloaded before it was forgotten
    assert "alpha" not in {m.id for m in lib.list()}
    assert any(isinstance(e, ModelUnloaded) for e in seen)
    assert isinstance(seen[-1], LibraryChanged)


async def test_resolve_model_by_path_imports_it(hearth: Hearth, tmp_path: Path) -> None:
    p = write_model(tmp_path / "new" / "fresh.gguf")
    m = await hearth.models.resolve(str(p))
    assert m.id == "fresh" and hearth.models._library.get("fresh") == m
    assert (await hearth.models.resolve("fresh")) == m
    with pytest.raises(ModelNotFound):
        await hearth.models.resolve("missing")
