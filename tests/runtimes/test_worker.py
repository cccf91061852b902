"""The worker thread in front of a native engine (app/runtimes/worker.py,
with a scripted engine): the queue's order (priority, interactive requests first, then FIFO),
cancellation, errors sent back, shutdown."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from app.core.types import Delta, GenerationRequest
from app.errors import ModelUnloaded, QueueFull
from app.runtimes.worker import INTERACTIVE_MAX_TOKENS, Again, DeltaStream, Sequence, Worker
from tests.support.fakes import ScriptEngine


def req(
    rid: str,
    *,
    max_tokens: int | None = None,
    stop: tuple[str, ...] = (),
    n_prompt: int = 3,
    priority: int = 0,
) -> GenerationRequest:
    return GenerationRequest(
        prompt_tokens=tuple(range(5, 5 + n_prompt)),
        max_tokens=max_tokens,
        stop=stop,
        request_id=rid,
        priority=priority,
    )


async def drain(stream: DeltaStream, timeout: float = 5.0) -> list[Delta]:
    async def collect() -> list[Delta]:
        return [d async for d in stream]

    return await asyncio.wait_for(collect(), timeout)


def text_of(deltas: list[Delta]) -> str:
    return "".join(d.text for d in deltas)


async def wait_until(cond: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.005)


@pytest.fixture
def engine() -> ScriptEngine:
    return ScriptEngine()


@pytest.fixture
def worker(engine: ScriptEngine) -> Iterator[Worker]:
    w = Worker(engine, name="test", queue_size=8)
    yield w
    w.close(timeout=10)


async def test_generates_and_finishes(worker: Worker, engine: ScriptEngine) -> None:
    deltas = await drain(worker.submit(req("a", n_prompt=7)))
    assert [d.text for d in deltas[:-1]] == ["Hello", ",", " world"]
    assert all(d.token_count == 1 and d.finish_reason is None for d in deltas[:-1])
    final = deltas[-1]
    assert final.finish_reason == "stop" and final.text == "" and final.error is None
    assert final.usage is not None
    assert (final.usage.prompt_tokens, final.usage.completion_tokens) == (7, 3)
    assert final.usage.total_tokens == 10
    assert (
        final.timings is not None and final.timings.predicted_n == 3 and final.timings.prompt_n == 7
    )
    assert engine.ended == ["a"]
    assert engine.thread_names == {"hearth-worker-test"}  # the engine is only touched by its thread
    # pending drops just after the final delta is pushed (the worker closes, then forgets it)
    await wait_until(lambda: worker.pending == 0)


async def test_fifo_order(worker: Worker, engine: ScriptEngine) -> None:
    engine.gate.clear()
    streams = [worker.submit(req(f"r{i}")) for i in range(6)]
    await asyncio.to_thread(engine.began.wait, 5)
    assert worker.pending == 6
    engine.gate.set()
    results = [await drain(s) for s in streams]
    assert engine.begun == [f"r{i}" for i in range(6)]
    assert all(text_of(r) == "Hello, world" and r[-1].finish_reason == "stop" for r in results)


async def test_cancel_a_queued_request(worker: Worker, engine: ScriptEngine) -> None:
    engine.gate.clear()
    first = worker.submit(req("first"))
    queued = worker.submit(req("queued"))
    await asyncio.to_thread(engine.began.wait, 5)
    queued.cancel()
    engine.gate.set()
    q = await drain(queued)
    assert text_of(q) == ""
    assert q[-1].finish_reason == "cancelled"
    assert q[-1].usage is not None and q[-1].usage.completion_tokens == 0
    assert text_of(await drain(first)) == "Hello, world"
    assert engine.begun == ["first"]  # the cancelled request never reached the engine


async def test_the_queue_serves_lower_priority_then_interactive_requests_first(
    worker: Worker, engine: ScriptEngine
) -> None:
    """vLLM's ``priority`` (lower first), then interactive requests (a negative priority, or
    a short answer: an editor's completion) before the others of their priority, then FIFO."""
    engine.gate.clear()
    first = worker.submit(req("first"))
    await asyncio.to_thread(engine.began.wait, 5)
    streams = [
        worker.submit(req("long0")),
        worker.submit(req("later", priority=5, max_tokens=8)),
        worker.submit(req("short", max_tokens=INTERACTIVE_MAX_TOKENS)),
        worker.submit(req("urgent", priority=-1)),
        worker.submit(req("long1", max_tokens=INTERACTIVE_MAX_TOKENS + 1)),
    ]
    engine.gate.set()
    for s in [first, *streams]:
        assert (await drain(s))[-1].finish_reason == "stop"
    assert engine.begun == ["first", "urgent", "short", "long0", "long1", "later"]


async def test_a_cancelled_queued_request_leaves_the_queue_before_any_work() -> None:
    """A waiting request whose client went away leaves the queue at the next step, while the
    running one goes on: it never reaches the engine, no longer counts as pending or against
    the queue's size, and its final delta says no prompt was read."""
    engine = ScriptEngine(pieces=None)  # generates until cancelled
    engine.step_permits = threading.Semaphore(0)
    w = Worker(engine, name="gone", queue_size=3)
    try:
        running = w.submit(req("running"))
        await asyncio.to_thread(engine.began.wait, 5)
        queued = [w.submit(req(f"q{i}")) for i in range(3)]
        assert w.queue_full and w.pending == 4
        for q in queued:
            q.cancel()
        assert not w.queue_full  # the queue holds no request anyone waits for
        engine.step_permits.release()  # one step of the running request
        await wait_until(lambda: w.pending == 1)
        for q in queued:
            final = (await drain(q))[-1]
            assert final.finish_reason == "cancelled"
            assert final.timings is not None and final.timings.prompt_n == 0
        assert engine.begun == ["running"]
        running.cancel()
        engine.step_permits.release()
        assert (await drain(running))[-1].finish_reason == "cancelled"
    finally:
        w.close(timeout=10)


async def test_cancel_during_generation_stops_within_one_step() -> None:
    engine = ScriptEngine(pieces=None)  # would generate forever
    engine.step_permits = threading.Semaphore(0)
    w = Worker(engine, name="cancel", queue_size=4)
    try:
        stream = w.submit(req("long"))
        engine.step_permits.release(3)
        it = stream.__aiter__()
        got = [await asyncio.wait_for(it.__anext__(), 5) for _ in range(3)]
        assert [d.text for d in got] == ["t0 ", "t1 ", "t2 "]
        stream.cancel()
        steps_at_cancel = engine.steps
        engine.step_permits.release(50)  # a worker that ignored the cancel would keep going
        rest = []
        async for d in it:
            rest.append(d)
        assert rest[-1].finish_reason == "cancelled"
        assert len(rest) - 1 <= 1  # at most the step already in flight
        assert engine.steps <= steps_at_cancel + 1
        await asyncio.sleep(0.1)
        assert engine.steps <= steps_at_cancel + 1
        await wait_until(lambda: w.pending == 0)
        assert engine.ended == ["long"]  # its slot was released
    finally:
        w.close(timeout=10)


async def test_consumer_leaving_early_cancels_the_request() -> None:
    engine = ScriptEngine(pieces=None)
    w = Worker(engine, name="leave", queue_size=4)
    try:
        stream = w.submit(req("gone"))
        async for _ in stream:
            break  # e.g. the HTTP client disconnected
        await wait_until(lambda: w.pending == 0)
        assert engine.ended == ["gone"]
        steps = engine.steps
        await asyncio.sleep(0.05)
        assert engine.steps == steps
        # the next request runs
        nxt = await drain(w.submit(req("next", max_tokens=2)))
        assert nxt[-1].finish_reason == "length"
    finally:
        w.close(timeout=10)


async def test_error_in_begin_is_sent_back_and_the_worker_carries_on(
    worker: Worker, engine: ScriptEngine
) -> None:
    engine.fail_begin = {"bad"}
    bad = worker.submit(req("bad"))
    good = worker.submit(req("good"))
    b = await drain(bad)
    assert text_of(b) == ""
    assert b[-1].finish_reason == "error"
    assert b[-1].error is not None and "prompt failed for bad" in b[-1].error
    g = await drain(good)
    assert text_of(g) == "Hello, world" and g[-1].finish_reason == "stop" and g[-1].error is None
    assert engine.ended == ["bad", "good"]


async def test_error_in_step_is_sent_back_and_the_worker_carries_on(
    worker: Worker, engine: ScriptEngine
) -> None:
    engine.fail_step = {"bad"}
    b = await drain(worker.submit(req("bad")))
    assert b[-1].finish_reason == "error"
    assert b[-1].error is not None and "decode failed for bad" in b[-1].error
    g = await drain(worker.submit(req("good")))
    assert text_of(g) == "Hello, world" and g[-1].finish_reason == "stop"


async def test_error_while_releasing_a_sequence_still_ends_the_stream(engine: ScriptEngine) -> None:
    def broken_end(seq: Sequence) -> None:
        raise RuntimeError("kv cache release failed")

    engine.end = broken_end  # type: ignore[method-assign]
    w = Worker(engine, name="end", queue_size=4)
    try:
        d = await drain(w.submit(req("a")))
        assert d[-1].finish_reason == "stop"
        d2 = await drain(w.submit(req("b")))
        assert text_of(d2) == "Hello, world"
    finally:
        w.close(timeout=10)


async def test_close_ends_outstanding_streams(engine: ScriptEngine) -> None:
    engine.gate.clear()
    w = Worker(engine, name="closing", queue_size=4)
    running = w.submit(req("running"))
    queued = w.submit(req("queued"))
    await asyncio.to_thread(engine.began.wait, 5)
    t0 = time.monotonic()
    await asyncio.to_thread(w.close, 10)
    assert time.monotonic() - t0 < 5
    for s in (running, queued):
        d = await drain(s)
        assert d[-1].finish_reason == "cancelled"
        assert text_of(d) == ""
    assert engine.shut_down.is_set()
    assert not w._thread.is_alive()
    assert engine.begun == ["running"]
    with pytest.raises(ModelUnloaded) as late:
        w.submit(req("late"))
    assert late.value.raced  # nothing of it ran: the gateway may load the model and retry


async def test_close_when_idle(engine: ScriptEngine) -> None:
    w = Worker(engine, name="idle", queue_size=4)
    await asyncio.to_thread(w.close, 5)
    assert engine.shut_down.is_set()
    assert not w._thread.is_alive()


async def test_stop_strings_are_never_emitted() -> None:
    engine = ScriptEngine(pieces=("Hel", "lo ST", "OP more", "never"))
    w = Worker(engine, name="stops", queue_size=4)
    try:
        d = await drain(w.submit(req("s", stop=("STOP",))))
        assert text_of(d) == "Hello "
        assert all("S" not in x.text and "OP" not in x.text for x in d)
        assert d[-1].finish_reason == "stop"
        assert engine.steps == 3  # finished on the step that completed the stop string
    finally:
        w.close(timeout=10)


async def test_held_back_prefix_is_released_at_the_end() -> None:
    engine = ScriptEngine(pieces=("a", "b S", "T"))
    w = Worker(engine, name="held", queue_size=4)
    try:
        d = await drain(w.submit(req("h", stop=("STOP",), max_tokens=2)))
        assert text_of(d) == "ab S"
        assert d[-1].finish_reason == "length"
        d2 = await drain(w.submit(req("h2", stop=("STOP",))))  # ends by EOS with "ST" held
        assert text_of(d2) == "ab ST"
        assert d2[-1].finish_reason == "stop"
    finally:
        w.close(timeout=10)


async def test_max_tokens_finishes_with_length() -> None:
    engine = ScriptEngine(pieces=None)
    w = Worker(engine, name="len", queue_size=4)
    try:
        d = await drain(w.submit(req("m", max_tokens=5, n_prompt=4)))
        assert text_of(d) == "t0 t1 t2 t3 t4 "
        assert d[-1].finish_reason == "length"
        assert d[-1].usage is not None
        assert (d[-1].usage.prompt_tokens, d[-1].usage.completion_tokens) == (4, 5)
    finally:
        w.close(timeout=10)


async def test_queue_full(engine: ScriptEngine) -> None:
    engine.gate.clear()
    w = Worker(engine, name="full", queue_size=2)
    try:
        streams = [w.submit(req("running"))]
        await asyncio.to_thread(engine.began.wait, 5)
        streams += [w.submit(req("q1")), w.submit(req("q2"))]
        with pytest.raises(QueueFull) as ei:
            w.submit(req("q3"))
        assert ei.value.retry_after >= 1 and ei.value.status == 429
        assert w.pending == 3
        engine.gate.set()
        for s in streams:
            assert (await drain(s))[-1].finish_reason == "stop"  # nobody was cut to make room
    finally:
        w.close(timeout=10)


async def test_several_sequences_step_together() -> None:
    engine = ScriptEngine(pieces=("x", "y"), max_sequences=3)
    w = Worker(engine, name="batch", queue_size=4)
    try:
        engine.gate.clear()
        streams = [w.submit(req(f"b{i}")) for i in range(3)]
        engine.gate.set()
        results = [await drain(s) for s in streams]
        assert all(text_of(r) == "xy" for r in results)
        assert engine.widest_step == 3
    finally:
        w.close(timeout=10)


async def test_a_job_that_goes_on_runs_again_after_the_running_sequences_step() -> None:
    engine = ScriptEngine(pieces=None)
    w = Worker(engine, name="again", queue_size=4)
    try:
        stream = w.submit(req("g"))
        it = stream.__aiter__()
        await asyncio.wait_for(it.__anext__(), 5)  # the generation runs
        seen: list[int] = []

        def job(cancelled: threading.Event) -> str | Again:
            seen.append(engine.steps)
            return Again(job) if len(seen) < 3 else "done"

        assert await asyncio.wait_for(w.run(job), 5) == "done"
        assert seen[0] < seen[1] < seen[2]  # the generation stepped between the pieces
        stream.cancel()
    finally:
        w.close(timeout=10)


async def test_sequence_counts_tokens_and_applies_stops() -> None:
    stream = DeltaStream(asyncio.get_running_loop())
    seq = Sequence(req("u", stop=("<end>",), max_tokens=100, n_prompt=9), stream)
    seq.emit_text("one two", tokens=2)
    seq.emit_text(" three<e", tokens=3)
    assert seq.finish_reason is None
    seq.emit_text("nd>tail", tokens=1)
    assert seq.finish_reason == "stop"
    seq.close()
    d = await drain(stream)
    assert text_of(d) == "one two three"
    assert [x.token_count for x in d[:-1]] == [2, 3]
    assert d[-1].usage is not None
    assert (d[-1].usage.prompt_tokens, d[-1].usage.completion_tokens) == (9, 6)


async def test_sequence_finish_keeps_the_first_reason() -> None:
    stream = DeltaStream(asyncio.get_running_loop())
    seq = Sequence(req("f", max_tokens=1), stream)
    seq.emit_text("a")
    assert seq.finish_reason == "length"
    seq.finish("cancelled")
    assert seq.finish_reason == "length"
    seq.close()
    assert (await drain(stream))[-1].finish_reason == "length"


async def test_a_first_token_reaches_its_consumer_before_the_next_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A sequence's first token: the worker waits (FIRST_TOKEN_SETTLE at most) until the loop
    has run what it woke before decoding on, since on a machine whose cores all decode the loop
    would wait for a CPU to send it. Later tokens do not wait."""
    import app.runtimes.worker as worker_mod

    monkeypatch.setattr(worker_mod, "FIRST_TOKEN_SETTLE", 30.0)  # never the limit here
    engine = ScriptEngine(("a", "b", "c", "d", "e", "f"))
    w = Worker(engine, name="settle")
    try:
        steps_seen = [engine.steps async for _ in w.submit(req("a"))]
        assert steps_seen[0] == 1, "the second step began before the first token was taken"
        assert steps_seen[-1] == 7  # six pieces, then the end
    finally:
        w.close(timeout=10)


async def test_an_engine_without_room_holds_the_next_request_back() -> None:
    """An engine's ``fits`` (room in its cache beside the running requests) keeps the next
    request queued while another runs, however many sequences it may decode at once; with
    nothing running, a request is always admitted."""

    class Full(ScriptEngine):
        def fits(self, seq: Sequence, active: list[Sequence]) -> bool:
            return False

    for engine, widest in (
        (Full(("a", "b"), max_sequences=4), 1),
        (ScriptEngine(("a", "b"), max_sequences=4), 2),
    ):
        w = Worker(engine, name="room")
        try:
            engine.gate.clear()  # the first request's prompt waits while the second queues
            first = w.submit(req("a"))
            await wait_until(lambda e=engine: e.began.is_set())  # type: ignore[misc]
            second = w.submit(req("b"))
            engine.gate.set()
            assert text_of(await drain(first)) == text_of(await drain(second)) == "ab"
            assert engine.widest_step == widest
        finally:
            w.close(timeout=10)
