"""Which waiting requests join the running ones (``LlamaEngine.fits``): room in a shared
cache, and how many sequences it decodes at once on the CPU; and how their prompts are read,
a piece a decode, so that none waits long behind another's.

In a shared (unified) cache with the attention on the CPU, every token of a step attends every
used cell of the cache, its own sequence's and the others' (masked). A step of W sequences of
m cells each (on average over their steps) costs about ``a + b*W + c*W*W*m``: a per step
(graph, threads, the worker's own work), b per token (the weights), c per token and cell (the
attention). A token then costs ``a/W + b + c*W*m``: more at once share ``a`` among more tokens,
but each token attends more cells. So the requests beyond ``BASE_WIDTH`` join the running ones
only when ``parallel`` at once costs a token no more than BASE_WIDTH at once (``goes_wide``).
The choice is between the two, not a width in between: a burst of 8 split 6 and 2, or 7 and
1, cost more than 4 and 4 (a decision per joining request, as the running ones' cells grew,
did that: 99 tok/s where 4 at once made 107).

Measured in process on 2 Intel Xeon cores with SmolLM2-135M (f16 cache, flash attention off;
8 greedy requests of 128 tokens, two rounds each; tokens a second of wall time, prompts read
included), 4 at once against 8 at once: prompts of ~39 tokens 168-179 against 176-206; ~69
tokens 137-143 against 146-153; ~139 tokens 107 against 105-109; ~189 tokens 93 against 88-90;
~339 tokens 59 against 55-56. Equal at ~139 tokens (m ~203 cells with half the answer):
``a = 32*c*m``, so a step's own cost is ~6,500 cells of one token's attention for that model
(``wide_cells``). Other models scale it by their weights' work per token against their
attention's work per cell: a bigger model's step costs more for the weights it reads, which
more sequences at once share.

A small request still joins beside long ones when it is of another kind (a quarter of their
average cells or less) and its joining pays (``small_joins``): beside 4 requests of ~330-token
prompts, a short question's first token came after 2.6-3.5 s (read with their prompts' last
pieces; ~0.8 s since short prompts are read first) instead of 6.9-7.3 s (one of them ended),
and they took no longer.

The first BASE_WIDTH sequences always decode together (several clients are served at once
whatever the cost, as peers' default of 4 does). Caches of their own per sequence (a cache
stream each) and attention on a GPU have no such bound: a step's attention reads only a
sequence's own cells there, and a GPU's attention was not measured.
A prompt is read PROMPT_PIECE tokens a decode, alone or beside running streams: between two
pieces the worker admits waiting requests and the running streams take their step, so a short
request (an editor's completion) arriving while an agent's long prompt is read joins within
one piece rather than after the whole prompt (2,000 tokens: seconds on a small CPU). The
joining prompts are read shortest first, an interactive one before the others (the worker's
``queue_order``), in a decode of at most PROMPT_PIECE tokens together (``_read_together``).
Each piece is one micro-batch, and a fresh run's pieces start at multiples of its size (what
the "exact" prompt cache reuses), so a cached prompt's numbers are still a fresh run's.
The size: a decode reads the model's weights once whatever its tokens, so each piece costs
about one one-token step more than reading the prompt in one go; with SmolLM2 on 2 Xeon cores
that step is ~10-20 ms and a prompt token ~0.5-1 ms, so a 256-token piece adds ~4-8% to
a piece's ~130-250 ms against ~2-4% for llama.cpp's default micro-batch of 512 (and twice that
for 128), while a request that arrives waits at most one piece: ~0.13-0.25 s instead of up to
the whole prompt (a 2,000-token agent prompt: ~1-2 s). Measured on a machine shared with other
work (load ~8 on 2 cores), so only the order of magnitude is known.
Tested by tests/runtimes/llama/test_width.py and tests/runtimes/llama/test_prompt_pieces.py.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import ctypes.util
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

from app.core.library.fit import CPU_PROMPT_PIECE
from app.core.types import GenerationRequest
from app.runtimes.llama.backend import L
from app.runtimes.worker import Sequence, common_prefix, interactive

# the most prompt tokens a decode reads (one micro-batch; smaller when the batch is): a
# request that arrives while a prompt is read waits for one piece. On a GPU a larger batch
# reads faster; on the CPU prompt reading is as fast in small pieces (llama-server on 2 EPYC
# cores, SmolLM2, a 614-token prompt: 197, 214, 193, 168, 186 tok/s with micro-batches of 32,
# 64, 128, 256, 512), so there a piece is PROMPT_PIECE_CPU: an editor's completion beside an
# agent's prompts waited for a 256-token piece ~1.2 s there (p95 TTFT 2.1 s), for 64 ~0.3 s
# (0.8 s), for 32 ~0.15 s (p95 0.44 s against 0.80 s for 64 in the same run, the agent's
# turns and the chats' tokens no slower; tests/bench/autocomplete_mix.py, one run each)
PROMPT_PIECE = 256
PROMPT_PIECE_CPU = CPU_PROMPT_PIECE  # the memory estimate counts it (app/core/library/fit.py)
# a decode of this many prompt tokens or more runs under llama.cpp's abort callback (a Python
# call per graph node, costly for a small decode): only an image's positions are that many,
# a text piece is seen to be cancelled before the next piece
ABORT_MIN_TOKENS = PROMPT_PIECE + 1

# the rows a decode holds beside the running streams' tokens for the joining prompts' last
# pieces (``_riders``): under llama.cpp's CPU attention tile (GGML_FA_TILE_Q, 64 query rows),
# so the streams' rows are computed as in a step of their own
RIDE_ROWS = 64
Rider = tuple[Sequence, Any, list[int]]  # a joining sequence, its state, its last piece

# the answer tokens a sequence is counted for when the shared cache's room is weighed (more come
# as others finish; a sequence that outgrows the cache parks the youngest)
ANSWER_ROOM = 256
BASE_WIDTH = 4
# a step's own cost in cells of attention for SmolLM2 (134,515,008 parameters, 30 layers of 576
# attention dimensions), per its parameters over its attention's dimensions
WIDE_CELLS_PER_RATIO = 6500.0 / (134_515_008 / (30 * 576))


def wide_cells(model: Any) -> float:
    """A decode step's own cost in cells of one token's attention, for ``model`` (a
    llama_model pointer): ~6,500 for SmolLM2, more for models whose weights weigh more against
    their attention."""
    params = max(1, int(L.llama_model_n_params(model)))
    attention = max(1, int(L.llama_model_n_layer(model)) * int(L.llama_model_n_embd(model)))
    return WIDE_CELLS_PER_RATIO * params / attention


def goes_wide(cells_each: float, most: int, step_cells: float) -> bool:
    """Whether requests of ``cells_each`` cells on average decode ``most`` at once rather than
    BASE_WIDTH: whether one round of ``most`` costs a token no more than rounds of BASE_WIDTH,
    ``a/most + c*most*m <= a/BASE_WIDTH + c*BASE_WIDTH*m``, i.e. ``m <= a/(c*most*BASE_WIDTH)``
    (~203 cells for SmolLM2 with ``most`` 8)."""
    return most * BASE_WIDTH * cells_each <= step_cells


def small_joins(cells: float, running: list[float], step_cells: float) -> bool:
    """Whether a request of ``cells`` cells joins the ``running`` ones (their cells) however
    long they are: when it is a different kind of request, a quarter of their average or less
    (a quick question beside an agent's long prompts), and adding it costs their tokens no more
    than it saves, ``c*B*(B+1)*cells <= a`` for B running (the running cells do not enter: its
    token attends them as each of theirs does). A burst of like requests is never split so."""
    width = len(running)
    return cells * 4 * width <= sum(running) and width * (width + 1) * cells <= step_cells


def _reading_order(joining: list[tuple[Sequence, Any]]) -> list[tuple[Sequence, Any]]:
    """Joining prompts in the order their pieces are read: an interactive or higher-priority
    one first (the worker's ``queue_order``), then the shortest rest."""
    return sorted(joining, key=lambda r: (r[0].order[:2], len(r[1].prompt) - r[1].done_upto))


class Admission:
    """LlamaEngine's admission: what the worker asks before a waiting request joins."""

    unified: bool  # one cache that the sequences share
    cache_tokens: int  # its cells
    n_ctx: int  # the most one sequence may hold
    step_cells: float  # ``wide_cells`` of the model; infinite: no bound on the width
    max_sequences: int  # the most decoded at once (``parallel``)

    ctx: Any
    mem: Any
    batch: Any
    prompt_piece: int  # the most prompt tokens a decode reads
    peak_batch: int
    vision: Any
    n_ubatch: int
    shares_prefixes: bool
    interrupts: Interrupts
    _aborting: tuple[Sequence, ...]
    _abort_cb: Any

    def fits(self, seq: Sequence, active: list[Sequence]) -> bool:
        """Whether ``seq`` joins the ``active`` sequences now: in a shared cache, when it has
        room for its prompt and the start of its answer (ANSWER_ROOM tokens at most) beside
        what they hold and will add (idle caches give way), and beyond BASE_WIDTH only while
        their cells are few enough that decoding them all at once pays (above), or when it is
        a small one whose joining pays (``small_joins``). BASE_WIDTH is counted per kind:
        interactive requests (a short answer or an infill: the worker's ``queue_order``) and
        the others. An interactive request's few steps cost long answers little, and it would
        otherwise wait for one of them to end (an editor's completions beside an agent and two
        chats waited ~1 s a keystroke for the one before); a burst of like requests is bounded
        as before.
        Admitted without room, it would park a running sequence, whose tokens are then read
        again: 8 requests of ~730 prompt and 200 answer tokens in a 4,096-cell cache, all at
        once, took 49.7 s (5 parked), 37.8 s with this check. Caches of their own per sequence
        (no sharing) always fit."""
        if not self.unified:
            return True
        held = sum(len(s.request.prompt_tokens) + s.generated for s in (*active, seq))
        answers = sum(self._answer_room(s.request, s.generated) for s in (*active, seq))
        if held + answers > self.cache_tokens:
            return False
        # interactive requests and requests with long answers count apart (below)
        kind = seq.order[1]
        if len([s for s in active if s.order[1] == kind]) < BASE_WIDTH:
            return True
        # each one's cells over its steps on average: its prompt and half the answer counted
        # ahead (from its start, so that the requests of one round weigh the same throughout)
        cells = [self._cells(s) for s in (*active, seq)]
        if goes_wide(sum(cells) / len(cells), self.max_sequences, self.step_cells):
            return True
        return small_joins(cells[-1], cells[:-1], self.step_cells)

    def _cells(self, seq: Sequence) -> float:
        return len(seq.request.prompt_tokens) + self._answer_room(seq.request) / 2

    def _answer_room(self, req: GenerationRequest, generated: int = 0) -> int:
        """An answer's tokens counted ahead: what its max_tokens leaves, at most ANSWER_ROOM."""
        left = self.n_ctx if req.max_tokens is None else req.max_tokens - generated
        return max(0, min(left, ANSWER_ROOM))

    @contextlib.contextmanager
    def _abortable(
        self, seqs: tuple[Sequence, ...], n_tokens: int, *, interruptible: str = "piece"
    ) -> Iterator[None]:
        """While ``n_tokens`` tokens decode: the decode stops when one of ``seqs`` is cancelled
        (a prompt's piece, an image's positions), and an ``interruptible`` one (its kind; "":
        not) of one micro-batch at most stops when an interactive request arrives, both through
        ``Interrupts``' flag, which llama.cpp reads between graph nodes. Where that flag cannot
        be had, a decode of ABORT_MIN_TOKENS or more (an image's positions) stops on a cancel
        through a Python callback: a GIL round trip per graph node, about a thousand a decode,
        which made a short prompt's decode take twice its time (7 tokens: ~40 ms, not ~20)."""
        kind = interruptible if n_tokens <= self.n_ubatch else ""
        if self.interrupts.available and (seqs or kind):
            self.interrupts.arm(kind, seqs)
            try:
                yield
            finally:
                self.interrupts.disarm()
        elif n_tokens >= ABORT_MIN_TOKENS and seqs:
            self._aborting = seqs
            L.llama_set_abort_callback(self.ctx, self._abort_cb, None)
            try:
                yield
            finally:
                self.interrupts.install()
                self._aborting = ()
        else:
            yield

    def _interrupted(self, rc: int, seqs: tuple[Sequence, ...]) -> bool:
        """Whether a decode that returned ``rc`` was stopped for an arriving interactive
        request (not for a cancel): llama.cpp took its micro-batch out of the cache, and it is
        decoded again after that request is read."""
        if rc != 2 or not self.interrupts.fired or any(s.cancelled for s in seqs):
            return False
        self.interrupts.stopped_now()
        return True

    def interrupt(self, request: GenerationRequest) -> bool:
        """An interactive request arrived (the event loop): stop the decode in flight when its
        prompt's rest is read ahead of the streams' step (``_read_ahead``: a slot holds all
        but a piece of it); whether the flag was raised."""
        if not self.shares_prefixes or not self.interrupts.available:
            return False
        tokens = list(request.prompt_tokens)
        _, have = self.slots.longest(tokens)  # type: ignore[attr-defined]
        if len(tokens) - have > self.prompt_piece:
            return False
        return self.interrupts.request()

    def clear_interrupt(self) -> None:
        """The worker looks at its queue now: an arrival before this is admitted anyway."""
        self.interrupts.clear()

    def watch_cancel(self, seq: Sequence) -> None:
        """A cancel of ``seq`` (any thread) stops the decode in flight when it reads ``seq``."""
        seq.stream.on_cancel = self.interrupts.cancel

    def _text_piece(self, tokens: list[int], start: int, most: int) -> list[int]:
        """Up to ``most`` prompt tokens from ``start``, ending before an image's positions."""
        chunk = tokens[start : start + most]
        if self.vision is not None:
            chunk = chunk[: next((i for i, t in enumerate(chunk) if t < 0), len(chunk))]
        return chunk

    def _read_together(self, joining: list[tuple[Sequence, Any]]) -> bool:
        """One llama_decode of the next pieces of the prompts being read, an interactive one and
        then the shortest rest first, as much as a piece holds; after the first, only whole
        rests of up to twice its length (a short question beside long prompts is read in a
        decode of its own; the others follow in the next steps). llama-server reads
        new prompts together too; the running streams' tokens stay in their own step, whose
        numbers then match a solo run's as closely as before. False when the cache had no room
        for it all, or a joining request was cancelled mid-batch: nothing of it stays in the
        cache, and the caller reads the prompts one by one."""
        n, deferred = 0, False
        pieces: list[tuple[Sequence, Any, list[int], int]] = []
        for seq, st in _reading_order(joining):
            start = st.done_upto
            chunk = self._text_piece(st.prompt, start, self.prompt_piece - n)
            last = start + len(chunk) == len(st.prompt)
            if not chunk:  # the decode is full, or an image comes next
                deferred = True
                continue
            if pieces and (not last or len(chunk) > 2 * len(pieces[0][2])):
                deferred = True  # read in a later step
                continue
            for j, t in enumerate(chunk):
                self._put(  # type: ignore[attr-defined]
                    n + j, t, start + j, st.slot, logits=last and j == len(chunk) - 1
                )
            n += len(chunk)
            pieces.append((seq, st, chunk, n - 1))
        if not pieces or (len(pieces) < 2 and not deferred):  # one prompt: a chunk of its own
            return False
        self.batch.n_tokens = n
        self.peak_batch = max(self.peak_batch, len(pieces))
        with self._abortable(tuple(p[0] for p in pieces), n):
            rc = self._decode()  # type: ignore[attr-defined]
        self._interrupted(rc, tuple(p[0] for p in pieces))
        if rc == 2:  # aborted: drop what the batch's earlier micro-batches wrote
            for _, st, _, _ in pieces:
                L.llama_memory_seq_rm(self.mem, st.slot, st.done_upto, -1)
        if rc in (1, 2):
            return False
        if rc != 0:
            self._fail([p[0] for p in pieces], rc)  # type: ignore[attr-defined]
        for seq, st, chunk, row in pieces:
            self.slots.append(st.slot, chunk)  # type: ignore[attr-defined]
            st.done_upto += len(chunk)
            if st.done_upto == len(st.prompt):
                self._prompt_read(seq, st, row)  # type: ignore[attr-defined]
            else:
                self._prompt_time_out(seq)
        return True

    def _riders(
        self, decoded: list[tuple[Sequence, Any]], reading: list[tuple[Sequence, Any]]
    ) -> list[Rider]:
        """The joining prompts whose whole rest (after what other slots share of their
        prefix) fits beside the ``decoded`` streams' tokens in fewer than RIDE_ROWS rows:
        they ride in the streams' decode and sample their first token from it, an interactive
        one and then the shortest first. An editor's keystroke adds a few tokens to a prompt
        the cache holds; read in a decode of its own after the streams' step, its first token
        came one decode later (llama-server puts new prompts in the streams' batch too)."""
        room = RIDE_ROWS - 1 - len(decoded)
        riders: list[Rider] = []
        for seq, st in _reading_order(reading):
            if room <= 0:
                break
            if st.ready or st.parked or st.failed or seq.cancelled:
                continue
            self._borrow(seq, st)  # type: ignore[attr-defined]
            rest = st.prompt[st.done_upto :]
            if 0 < len(rest) <= min(room, self.prompt_piece):
                riders.append((seq, st, rest))
                room -= len(rest)
        return riders

    def _read_ahead(self, riders: list[Rider], seqs: list[Sequence]) -> list[Rider]:
        """The interactive riders (an editor's keystroke) read in a decode of their own before
        the streams' step, their first tokens sent at once: a decode of their few rows (~15-30
        ms beside an agent and two chats on 2 cores) rather than the streams' whole step
        (~45-60 ms). The riders left for the streams' step (all of them when that decode found
        no room)."""
        ahead = [r for r in riders if interactive(r[0].request)]
        if not ahead or self._decode_step([], ahead) != 0:  # type: ignore[attr-defined]
            return riders
        self._rode(ahead, 0)  # type: ignore[attr-defined]
        seqs[0].deliver(first=True)
        return [r for r in riders if r not in ahead]

    def _rode(self, riders: list[Rider], row: int) -> None:
        """The riders' pieces were decoded after the streams' ``row`` tokens: their prompts
        are read; each samples its first token from its last row."""
        for seq, st, chunk in riders:
            self.slots.append(st.slot, chunk)  # type: ignore[attr-defined]
            st.done_upto += len(chunk)
            row += len(chunk)
            self._prompt_read(seq, st, row - 1)  # type: ignore[attr-defined]

    def _prompt_time_out(self, seq: Sequence) -> None:
        """End a request whose prompt has been read for longer than its ``max_prompt_ms``
        (llama-server's t_max_prompt_ms, which it leaves unimplemented): "length", no answer."""
        limit = seq.request.max_prompt_ms
        if limit is not None and (time.perf_counter() - seq.t_begin) * 1000 > limit:
            seq.finish("length")


# a common stretch of prompts read together that one of them reads alone, the others waiting
# a step to share it
SHARE_MIN = 64


def one_reader(joining: list[tuple[Sequence, Any]]) -> list[tuple[Sequence, Any]]:
    """The prompts that read a piece this step: of those that go on alike from the same place
    for SHARE_MIN tokens or more, one; the others share its cells at the next step instead of
    reading the same tokens beside it (a shorter common stretch is not worth their step)."""
    readers: list[Any] = []
    for _, st in joining:
        d = st.done_upto
        if not any(
            o.done_upto == d and len(o.prompt) > d < len(st.prompt) and o.prompt[d] == st.prompt[d]
            and common_prefix(o.prompt, st.prompt) >= d + SHARE_MIN
            for o in readers
        ):  # fmt: skip
            readers.append(st)
    return [r for r in joining if any(r[1] is o for o in readers)]


# -- stopping a decode for an interactive arrival ----------------------------------------
# Stopping a decode in flight when an editor's keystroke arrives, so that it is read first.
#
# A keystroke's request (an interactive one: app/runtimes/worker.py) that arrives while the worker
# decodes waits for that decode to end: the running streams' step (~45-60 ms beside an agent and
# two chats on 2 cores) or a piece of an agent's prompt (~0.15 s). The engine reads a keystroke's
# few new tokens ahead of the streams' step (``_read_ahead``), so what it waited for
# was the decode already under way. Now the arrival raises a flag that llama.cpp's abort callback
# reads between the graph's nodes: the decode stops within a node, llama.cpp takes the micro-batch's
# positions out of the cache, and the worker reads the keystroke first and that decode again after
# it. What the stopped decode had computed is lost, so ``Interrupts`` stops only a decode that has
# run less than half its typical time (past that, waiting for its end costs the keystroke less than
# the others lose), and only while the work lost so stays under WASTE_SHARE of the worker's time
# over the last WASTE_WINDOW_S. Either way the worker starts nothing more before it reads the
# keystroke (a joining prompt's next piece waited too).
#
# Measured with tests/bench/autocomplete_mix.py (75-90 s, 2 EPYC cores, against the commit before
# in the same run, seven runs, two with the order swapped): the keystrokes' TTFT p50 0.67-0.81x,
# p95 0.60-0.96x; the agent's turns 0.92-1.27x and the chats' tokens a second 0.86-1.23x (both
# 1.02x on average: this machine's spread from run to run, no direction); ~0.6 decodes stopped
# a second, nearly all the streams' step, 1.1% of the work lost. Stopping whatever ran (no
# half-time rule, no "nothing more") gave p50 0.61-0.81x and lost ~4%.
#
# The callback is C, not Python: a Python callback is a GIL round trip per graph node (about a
# thousand a decode), which doubled a short decode's time (``_abortable``). It is the C
# library's ``strlen`` over a two-byte buffer: the flag byte and a terminating zero, so it returns 1
# (true) once the flag is raised and 0 otherwise; ggml reads a ``bool`` from the return register's
# low byte, which holds exactly that. The flag is up only while a decode that may stop runs.
# Tested by tests/runtimes/llama/test_interrupt.py.

# the share of the worker's time that stopped decodes may cost, over the last WASTE_WINDOW_S:
# beside an agent and two chats one keystroke every 0.7 s stops about one step (~25 ms of it
# computed on average), ~4%
WASTE_SHARE = 0.05
WASTE_WINDOW_S = 10.0
TYPICAL_WEIGHT = 0.2  # of the newest decode in the moving mean of a kind's time


def _strlen() -> Any:
    """The C library's strlen as a ggml_abort_callback, or None where it cannot be found."""
    try:
        libc = ctypes.cdll.msvcrt if sys.platform == "win32" else ctypes.CDLL(None)
        return ctypes.cast(libc.strlen, L.ggml_abort_callback)
    except (OSError, AttributeError):
        name = ctypes.util.find_library("c")
        if name is None:
            return None
        return ctypes.cast(ctypes.CDLL(name).strlen, L.ggml_abort_callback)


class Interrupts:
    """What an interactive arrival asks of the worker (``request``, on the event loop): the
    worker starts no more work before it reads that request (``waiting``), and the armed
    decode in flight stops (the flag is ``raised``) when it has run less than half its
    typical time and the work stopped decodes lost lately is under its bound; past half,
    waiting for its end costs the request less than stopping it costs the others.

    The callback is installed once, over one flag; only an ``arm``-ed decode (on the worker)
    can see it raised: the loop raises it, and the worker lowers it after the decode, under one
    lock, so a raise never reaches a decode that may not stop. (Setting llama.cpp's callback
    per decode logs a debug line through a Python callback each time: two more GIL round trips
    a decode on the worker.) ``clear`` runs where the worker looks at its queue. A cancel of a
    sequence the armed decode reads raises the flag too (``cancel``), whatever its kind."""

    def __init__(
        self, ctx: Any, *, share: float = WASTE_SHARE, window_s: float = WASTE_WINDOW_S
    ) -> None:
        self.ctx = ctx
        self.share, self.window_s = share, window_s
        self._callback = _strlen()
        self._flag = ctypes.create_string_buffer(2)  # the flag byte and strlen's end
        self.waiting = False
        self.fired = False  # whether the flag was up when the last armed decode ended
        self._kind = ""
        self._seqs: tuple[Any, ...] = ()  # the sequences whose cancel stops the armed decode
        self._armed_at = 0.0  # when the armed decode started; 0: none runs
        self._ran = 0.0  # how long the last armed decode ran
        self._typical: dict[str, float] = {}  # an armed decode's time by kind (a moving mean)
        self._lost: collections.deque[tuple[float, float]] = collections.deque()  # (when, s)
        self._lost_s = 0.0
        self._lock = threading.Lock()
        self.stopped = 0  # decodes stopped so far
        self.available = self._callback is not None
        self.install()

    def install(self) -> None:
        """Put this flag's callback in place (again, after another was installed a while)."""
        if self.available:
            L.llama_set_abort_callback(self.ctx, self._callback, ctypes.addressof(self._flag))
        else:
            L.llama_set_abort_callback(self.ctx, L.ggml_abort_callback(), None)

    @property
    def raised(self) -> bool:
        return self._flag.raw[0] != 0

    def request(self) -> bool:
        """An interactive request arrived; whether the decode in flight stops for it (an
        armed decode that starts before the worker admits it stops at once: ``arm``)."""
        self.waiting = True
        now = time.monotonic()
        with self._lock:
            started, typical = self._armed_at, self._typical.get(self._kind)
            if not started or not self._kind or typical is not None and now - started > typical / 2:
                return False
            self._expire(now)
            if self._lost_s >= self.share * self.window_s:
                return False
            self._flag[0] = b"\x01"
        return True

    def clear(self) -> None:
        with self._lock:
            self.waiting = False
            self._flag[0] = b"\x00"

    def arm(self, kind: str, seqs: tuple[Any, ...] = ()) -> None:
        """The next decode may stop: for an interactive request when it has a ``kind`` (what
        its typical time is kept by), and when one of ``seqs`` is cancelled; at once if one
        waits or is cancelled already."""
        if not self.available:
            return
        with self._lock:
            self._kind, self._seqs = kind, seqs
            self._armed_at = time.monotonic()
            if kind and self.waiting or any(s.cancelled for s in seqs):
                self._flag[0] = b"\x01"

    def cancel(self, stream: Any) -> None:
        """A sequence's ``stream`` was cancelled (any thread): the armed decode stops if it
        reads that sequence."""
        with self._lock:
            if self._armed_at and any(s.stream is stream for s in self._seqs):
                self._flag[0] = b"\x01"

    def disarm(self) -> None:
        """After an armed decode: the flag goes down; ``fired`` says whether it was up."""
        if not self._armed_at:
            return
        with self._lock:
            self.fired = self.raised
            self._flag[0] = b"\x00"
            self._ran = time.monotonic() - self._armed_at
            self._armed_at, self._seqs = 0.0, ()
        if not self.fired and self._kind:  # it ran to its end
            old = self._typical.get(self._kind)
            self._typical[self._kind] = (
                self._ran if old is None else old + (self._ran - old) * TYPICAL_WEIGHT
            )

    def stopped_now(self) -> None:
        """The last armed decode was stopped by the flag: the time it ran is lost."""
        now = time.monotonic()
        with self._lock:
            self._lost.append((now, self._ran))
            self._lost_s += self._ran
            self._expire(now)
        self.stopped += 1

    def _expire(self, now: float) -> None:
        while self._lost and self._lost[0][0] < now - self.window_s:
            self._lost_s -= self._lost.popleft()[1]
