"""The thread that owns a native model.

Requests enter with ``submit(request)`` from the event loop and come back as a cancellable async
stream of deltas. The worker admits up to ``engine.max_sequences`` requests at once and advances
all active sequences one step at a time, so an engine that can decode several sequences in one
batch (continuous batching) plugs in without changing this interface. Errors are sent back
through the stream; the thread never dies with a request outstanding.

Waiting requests are admitted in ``queue_order``: the lowest ``priority`` first (vLLM's),
then interactive ones (``interactive``: an editor's completion, a short answer) before the
others, then in arrival order. A waiting request whose client went away (its stream was
cancelled) leaves the queue before any work is done for it.
Tested by tests/runtimes/test_worker.py.
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import contextlib
import itertools
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from app.core.inference.text import StopMatcher
from app.core.types import Delta, GenerationRequest, Timings, TokenLogprob, Usage
from app.errors import ModelUnloaded, QueueFull

log = logging.getLogger(__name__)

_END = object()
T = TypeVar("T")

# The stack of the threads that own a model, where grammars are compiled and run: llama.cpp's
# grammar code recurses ~450 bytes a nesting level, and the default is 8 MiB on Linux, 512 KiB on
# macOS; a known size keeps app/runtimes/grammar/gbnf.py's depth bounds far from an overflow.
THREAD_STACK_BYTES = 16 * 1024 * 1024
# how long the worker waits, at most, for the event loop to send a first token before it decodes
# on (its threads would take the CPU the loop needs)
FIRST_TOKEN_SETTLE = 0.005
_stack_size_lock = threading.Lock()
# an answer of at most this many tokens is interactive: an editor's completion of a line or two,
# a title, a yes/no. Read and decoded in well under a second on a small model, serving it first
# delays the request it passes by that much, while it would wait seconds behind that one's prompt
INTERACTIVE_MAX_TOKENS = 64


def interactive(request: GenerationRequest) -> bool:
    """Whether a request is served before the others of its ``priority``: a negative priority
    (an infill asks for one), or a short answer (INTERACTIVE_MAX_TOKENS at most)."""
    short = request.max_tokens is not None and request.max_tokens <= INTERACTIVE_MAX_TOKENS
    return request.priority < 0 or short


def queue_order(request: GenerationRequest, arrival: int) -> tuple[int, int, int]:
    """A waiting request's place: lower ``priority``, then interactive, then earlier first."""
    return (request.priority, 0 if interactive(request) else 1, arrival)


def start_thread(target: Callable[[], None], *, name: str) -> threading.Thread:
    """Start a daemon thread with THREAD_STACK_BYTES of stack."""
    thread = threading.Thread(target=target, name=name, daemon=True)
    with _stack_size_lock:  # the size is process-wide, read when a thread starts
        try:
            previous = threading.stack_size(THREAD_STACK_BYTES)
        except (ValueError, RuntimeError):  # a platform that cannot set it: its default
            log.warning("cannot set a %d-byte thread stack here", THREAD_STACK_BYTES)
            thread.start()
            return thread
        try:
            thread.start()
        finally:
            threading.stack_size(previous)
    return thread


def _settle(
    loop: asyncio.AbstractEventLoop,
    fut: asyncio.Future[Any],
    *,
    result: Any = None,
    exc: BaseException | None = None,
) -> None:
    def apply() -> None:
        if fut.done():
            return
        if exc is not None:
            fut.set_exception(exc)
        else:
            fut.set_result(result)

    try:
        loop.call_soon_threadsafe(apply)
    except RuntimeError:  # the loop is closed: nobody waits any more
        pass


class Outbox:
    """Deltas the worker thread produced during one step, handed to each event loop in one
    call: a step of eight sequences wakes the loop once, not eight times (on a machine whose
    cores all decode, every wakeup and syscall of the loop slows the step)."""

    def __init__(self) -> None:
        self._items: list[tuple[DeltaStream, object]] = []

    def add(self, stream: DeltaStream, item: object) -> None:
        self._items.append((stream, item))

    def flush(self, settle: float = 0.0) -> None:
        """Hand the deltas to their loops. With ``settle`` (seconds), wait at most that long
        for the loops to have run what the deltas woke (a first token written to its client)
        before the worker goes on: on a machine whose cores all decode, the next step's
        threads would otherwise take the CPU the loop needs to send it."""
        if not self._items:
            return
        items, self._items = self._items, []
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[DeltaStream, object]]] = {}
        for stream, item in items:
            by_loop.setdefault(stream.loop, []).append((stream, item))
        settled = [threading.Event() for _ in by_loop] if settle > 0 else []
        for i, (loop, batch) in enumerate(by_loop.items()):
            try:
                loop.call_soon_threadsafe(_deliver, batch, settled[i] if settled else None)
            except RuntimeError:  # loop closed: nobody is listening any more
                for stream, _ in batch:
                    stream.cancelled.set()
                if settled:
                    settled[i].set()
        deadline = time.perf_counter() + settle
        for ev in settled:
            ev.wait(max(0.0, deadline - time.perf_counter()))


def _deliver(batch: list[tuple[DeltaStream, object]], settled: threading.Event | None) -> None:
    for stream, item in batch:
        stream.queue.put_nowait(item)
    if settled is not None:  # after the tasks these woke have run their step
        asyncio.get_running_loop().call_soon(settled.set)


class DeltaStream:
    """An async iterator of deltas fed from the worker thread; ``cancel()`` is thread-safe.

    With an ``outbox``, the worker's pushes wait in it until the worker flushes it."""

    def __init__(self, loop: asyncio.AbstractEventLoop, outbox: Outbox | None = None) -> None:
        self.loop = loop
        self.queue: asyncio.Queue[object] = asyncio.Queue()
        self.cancelled = threading.Event()
        self._outbox = outbox
        self._done = False
        self.on_cancel: Callable[[DeltaStream], None] | None = None  # the engine's, after the set

    # worker side ------------------------------------------------------------------------
    def push(self, delta: Delta) -> None:
        self._send(delta)

    def close(self) -> None:
        self._send(_END)

    def deliver(self, settle: float = 0.0) -> None:
        """Hand what the worker's outbox holds (every stream's deltas) to the loops now, not
        after the engine's step (Outbox.flush)."""
        if self._outbox is not None:
            self._outbox.flush(settle)

    def _send(self, item: object) -> None:
        if self._outbox is not None:
            self._outbox.add(self, item)
            return
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)
        except RuntimeError:  # loop closed: nobody is listening any more
            self.cancelled.set()

    # consumer side ----------------------------------------------------------------------
    def cancel(self) -> None:
        self.cancelled.set()
        if self.on_cancel is not None:
            self.on_cancel(self)

    def __aiter__(self) -> AsyncIterator[Delta]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Delta]:
        try:
            while not self._done:
                item = await self.queue.get()
                if item is _END:
                    self._done = True
                    return
                yield item  # type: ignore[misc]
        finally:
            if not self._done:  # consumer left early (disconnect, stop string in caller...)
                self.cancel()


class NativeLifetime:
    """Keeps a native model alive while other threads call into it.

    Calls made outside the worker thread (tokenize, detokenize, a grammar check, reading
    metadata) run inside ``hold()``. Before the worker frees the model it calls ``retire()``,
    which refuses new holds and waits for the running ones to finish, so no native call can
    touch freed memory whichever way the model goes (unload, eviction, keep-alive, shutdown).
    """

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._holders = 0
        self._retired = False

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        """Raises ModelUnloaded once the model is being freed."""
        with self._cv:
            if self._retired:
                raise ModelUnloaded("the model was unloaded while this request needed it")
            self._holders += 1
        try:
            yield
        finally:
            with self._cv:
                self._holders -= 1
                if not self._holders:
                    self._cv.notify_all()

    def retire(self) -> None:
        """No new holds from now on; returns once every running one has ended."""
        with self._cv:
            self._retired = True
            while self._holders:
                self._cv.wait()


def common_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens two token lists share (for prompt-cache reuse)."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class Sequence:
    """One admitted request as the engine sees it."""

    def __init__(
        self, request: GenerationRequest, stream: DeltaStream, prepared: object = None
    ) -> None:
        self.request = request
        self.stream = stream
        # what its model prepared off this thread for the engine (llama.cpp: the grammar)
        self.prepared = prepared
        self.stop = StopMatcher(request.stop)
        self.generated = 0
        self.cached = 0
        self.finish_reason: str | None = None
        self.error: str | None = None
        self.t_start = time.perf_counter()
        self.t_begin = 0.0  # admitted: its prompt starts being read
        self.t_prompt_done = 0.0
        self.batch_sum = 0  # sequences in each of its decode steps, added up
        self.batch_steps = 0
        self.threads = 0  # the engine's decode threads (set by engines that tune them)
        self.cpu_busy = False  # fewer than the cores: other programs keep the CPU busy
        self.drafted = 0  # speculative decoding: tokens drafted, and those the sampler kept
        self.draft_kept = 0
        self.engine_state: object = None
        self.unloaded = False  # cancelled because its model is being freed
        self.order: tuple[int, int, int] = (0, 0, 0)  # its place in the queue (queue_order)

    @property
    def cancelled(self) -> bool:
        return self.stream.cancelled.is_set()

    def deliver(self, first: bool) -> None:
        """Send the tokens this step picked (every sequence's) to the clients now: an engine
        whose step goes on to a long decode (a joining prompt's piece) calls it first. With a
        ``first`` token among them, wait a moment for the loop to write it (FIRST_TOKEN_SETTLE)
        before the decode takes the cores."""
        self.stream.deliver(FIRST_TOKEN_SETTLE if first else 0.0)

    def emit_text(
        self, text: str, tokens: int = 1, logprobs: tuple[TokenLogprob, ...] = ()
    ) -> None:
        """Send decoded text (stop strings applied) and count ``tokens``; may finish the sequence."""
        self.generated += tokens
        out, hit = self.stop.feed(text)
        if out or logprobs:
            self.stream.push(
                Delta(text=out, token_count=tokens, logprobs=logprobs, cpu_busy=self.cpu_busy)
            )
        if hit:
            self.finish_reason = "stop"
        elif self.request.max_tokens is not None and self.generated >= self.request.max_tokens:
            self.finish_reason = "length"

    def finish(self, reason: str) -> None:
        if self.finish_reason is None:
            self.finish_reason = reason

    def close(self) -> None:
        tail = self.stop.flush()
        if tail and self.finish_reason not in ("cancelled", "error"):
            self.stream.push(Delta(text=tail))
        now = time.perf_counter()
        t_prompt = self.t_prompt_done or now
        t_begin = self.t_begin or t_prompt
        # a request that left the queue (its client went away) read no prompt
        read = len(self.request.prompt_tokens) - self.cached if self.t_begin else 0
        timings = Timings(
            prompt_n=read,
            prompt_ms=(t_prompt - t_begin) * 1000,
            predicted_n=self.generated,
            predicted_ms=(now - t_prompt) * 1000,
            cache_n=self.cached,
            prepare_ms=self.request.prepare_ms,
            queue_ms=(t_begin - self.t_start) * 1000,
            batch_size=self.batch_sum / self.batch_steps if self.batch_steps else 0.0,
            threads=self.threads,
            cpu_busy=self.cpu_busy,
            draft_n=self.drafted,
            draft_n_accepted=self.draft_kept,
        )
        usage = Usage(len(self.request.prompt_tokens), self.generated, self.cached)
        self.stream.push(
            Delta(
                finish_reason=self.finish_reason or "stop",  # type: ignore[arg-type]
                usage=usage,
                timings=timings,
                error=self.error,
                stop_string=self.stop.matched,
                error_code="model_unloaded"
                if self.unloaded and self.finish_reason == "cancelled"
                else None,
            )
        )
        self.stream.close()


class Engine(Protocol):
    """What a runtime implements for the worker: prompt processing and decode steps."""

    max_sequences: int

    def begin(self, seq: Sequence) -> None:
        """Process the prompt of ``seq`` (may check ``seq.cancelled`` to abort)."""

    def step(self, seqs: list[Sequence]) -> None:
        """Advance every active sequence by one token, calling ``emit_text`` / ``finish``."""

    def end(self, seq: Sequence) -> None:
        """Release what ``seq`` held (its KV cache cells)."""

    def shutdown(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Again:
    """What a job returns to go on after the running sequences' next step (a long job done in
    bounded pieces, so it never holds their tokens back for long): ``fn`` is called then, with
    the same ``cancelled``."""

    fn: Callable[[threading.Event], Any]


class Worker:
    """Owns an engine on one thread; a bounded FIFO queue in front of it."""

    def __init__(self, engine: Engine, *, name: str, queue_size: int = 16) -> None:
        self.engine = engine
        self.queue_size = queue_size
        self._waiting: list[Sequence] = []  # in queue_order
        self._arrivals = itertools.count()
        self._jobs: collections.deque[
            tuple[Callable[[threading.Event], Any], asyncio.Future[Any], threading.Event]
        ] = collections.deque()
        self._job_cancel: threading.Event | None = None  # the running job's
        self._active: list[Sequence] = []
        self._outbox = Outbox()  # only the worker thread adds to it and flushes it
        self._interrupt = getattr(engine, "interrupt", lambda _request: False)
        self._clear_interrupt = getattr(engine, "clear_interrupt", lambda: None)
        self._cv = threading.Condition()
        self._stopping = False
        self._thread = start_thread(self._run, name=f"hearth-worker-{name}")

    @property
    def pending(self) -> int:
        with self._cv:
            return len(self._waiting) + len(self._active)

    @property
    def queue_full(self) -> bool:
        """Whether :meth:`submit` would refuse a request now (QueueFull): /health's ``busy``."""
        with self._cv:
            return self._queued() >= self.queue_size

    def _queued(self) -> int:
        """Waiting requests whose clients still wait (a cancelled one leaves at the next step)."""
        return sum(not s.cancelled for s in self._waiting)

    def submit(self, request: GenerationRequest, prepared: object = None) -> DeltaStream:
        """Queue a request (call on the event loop), with what its model prepared for the
        engine (``Sequence.prepared``). Raises QueueFull when the queue is full."""
        stream = DeltaStream(asyncio.get_running_loop(), self._outbox)
        with self._cv:
            if self._stopping:
                raise ModelUnloaded("the model is unloading; retry to load it again", raced=True)
            queued = self._queued()
            if queued >= self.queue_size:
                raise QueueFull(
                    f"too many requests queued for this model ({self.queue_size}); retry shortly",
                    retry_after=max(1, queued // 2),
                )
            seq = Sequence(request, stream, prepared)
            seq.order = queue_order(request, next(self._arrivals))
            bisect.insort(self._waiting, seq, key=lambda s: s.order)
            room = len(self._active) < self.engine.max_sequences  # to stop the decode in flight
            if room and self._waiting[0] is seq and interactive(request):
                self._interrupt(request)
            self._cv.notify()
        return stream

    def run(self, fn: Callable[[threading.Event], T | Again]) -> asyncio.Future[T]:
        """Run ``fn(cancelled)`` on the worker thread between decode steps (call on the loop).

        For work that needs the native context but is not a generation (embeddings). A long
        job checks ``cancelled`` between its pieces: it is set when the caller stops waiting
        (the future is cancelled) or the model is closing. A job that returns :class:`Again`
        goes on after the next step. Raises QueueFull when the queue is full.
        """
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[T] = loop.create_future()
        cancel = threading.Event()
        fut.add_done_callback(lambda f: cancel.set() if f.cancelled() else None)
        with self._cv:
            if self._stopping:
                raise ModelUnloaded("the model is unloading; retry to load it again", raced=True)
            if len(self._jobs) + self._queued() >= self.queue_size:
                raise QueueFull(
                    f"too many requests queued for this model ({self.queue_size}); retry shortly"
                )
            self._jobs.append((fn, fut, cancel))
            self._cv.notify()
        return fut

    def _run_jobs(self) -> None:
        with self._cv:
            queued = len(self._jobs)  # a job that goes on (Again) waits for the next step
        for _ in range(queued):
            with self._cv:
                if not self._jobs:
                    return
                fn, fut, cancel = self._jobs.popleft()
                if self._stopping:
                    cancel.set()
                self._job_cancel = cancel
            loop = fut.get_loop()
            try:
                result = fn(cancel)
            except BaseException as e:  # noqa: BLE001 - sent back to the caller
                _settle(loop, fut, exc=e)
            else:
                if isinstance(result, Again):
                    with self._cv:
                        self._jobs.append((result.fn, fut, cancel))
                else:
                    _settle(loop, fut, result=result)
            finally:
                with self._cv:
                    self._job_cancel = None

    def close(self, timeout: float = 30.0) -> None:
        """Cancel everything, stop the thread and free the engine."""
        with self._cv:
            self._stopping = True
            for s in list(self._waiting) + self._active:
                s.unloaded = True
                s.stream.cancel()
            for _, _, cancel in self._jobs:
                cancel.set()
            if self._job_cancel is not None:
                self._job_cancel.set()
            self._cv.notify()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    def _admit(self) -> None:
        # an engine may also hold a request back while its cache has no room for it beside the
        # running ones (admitted, it would park one of them, whose tokens are read again)
        fits = getattr(self.engine, "fits", None)
        while self._waiting and len(self._active) < self.engine.max_sequences:
            if self._active and fits is not None and not fits(self._waiting[0], self._active):
                break
            seq = self._waiting.pop(0)
            self._active.append(seq)

    def _leave_cancelled(self) -> list[Sequence]:
        """Take the waiting requests whose clients went away out of the queue (an editor
        cancels most of the completions it asks for): nothing is done for them."""
        gone = [s for s in self._waiting if s.cancelled]
        if gone:
            self._waiting = [s for s in self._waiting if not s.cancelled]
        return gone

    def _run(self) -> None:
        try:
            while True:
                with self._cv:
                    while (
                        not self._stopping
                        and not self._waiting
                        and not self._active
                        and not self._jobs
                    ):
                        self._cv.wait()
                    if self._stopping and not self._waiting and not self._active:
                        for _, fut, _ in self._jobs:
                            _settle(
                                fut.get_loop(), fut, exc=ModelUnloaded("the model was unloaded")
                            )
                        self._jobs.clear()
                        return
                    self._clear_interrupt()
                    gone = self._leave_cancelled()
                    new = len(self._active)
                    self._admit()
                    fresh = self._active[new:]
                for seq in gone:
                    seq.finish("cancelled")
                    seq.close()
                if gone:
                    self._outbox.flush()
                self._run_jobs()
                for seq in fresh:
                    self._begin(seq)
                    # a long prompt's first token goes out at once, on a free CPU
                    self._outbox.flush(FIRST_TOKEN_SETTLE if seq.generated else 0.0)
                unsent = [s for s in self._active if not s.generated]
                self._step()
                first = any(s.generated for s in unsent)  # a first token in this step
                self._outbox.flush(FIRST_TOKEN_SETTLE if first else 0.0)
        finally:
            with self._cv:
                leftovers = list(self._waiting) + self._active
                self._waiting.clear()
                self._active.clear()
            for s in leftovers:
                s.unloaded = True
                s.finish("cancelled")
                s.close()
            self._outbox.flush()
            try:
                self.engine.shutdown()
            except Exception:
                log.exception("engine shutdown failed")

    def _begin(self, seq: Sequence) -> None:
        if seq.cancelled:
            seq.finish("cancelled")
            return
        seq.t_begin = time.perf_counter()
        try:
            self.engine.begin(seq)
            if not seq.t_prompt_done:  # an engine that reads it over several steps sets it
                seq.t_prompt_done = time.perf_counter()
        except Exception as e:  # sent back to the caller, never kills the thread
            log.exception("prompt processing failed")
            seq.error = str(e) or type(e).__name__
            seq.finish("error")
        if seq.cancelled:
            seq.finish("cancelled")

    def _step(self) -> None:
        running = [s for s in self._active if s.finish_reason is None and not s.cancelled]
        if running:
            try:
                self.engine.step(running)
            except Exception as e:
                log.exception("decode step failed")
                for s in running:
                    s.error = str(e) or type(e).__name__
                    s.finish("error")
        with self._cv:
            done = [s for s in self._active if s.finish_reason is not None or s.cancelled]
            if done:  # out of the count before the caller sees the final delta
                self._active = [s for s in self._active if s not in done]
        for s in done:
            if s.cancelled:
                s.finish("cancelled")
            try:
                self.engine.end(s)
            except Exception:
                log.exception("releasing a sequence failed")
            s.close()
