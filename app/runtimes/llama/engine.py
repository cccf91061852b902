"""LlamaEngine: one GGUF model driven through llama-cpp-python's low-level API on its worker
thread (tokenize, decode, sample, detokenize; sequences share one batch; prompt cache by slot).
Tested by tests/runtimes/llama/test_mixed_batch.py."""

from __future__ import annotations

import codecs
import ctypes
import logging
import math
import time
from typing import Any

from app.core.library.fit import KV_BYTES, cache_slots, separate_caches
from app.core.types import GenerationRequest, LoadOptions, LocalModel
from app.errors import InvalidRequest, ModelLoadFailed
from app.runtimes.llama.admission import (
    PROMPT_PIECE,
    PROMPT_PIECE_CPU,
    Admission,
    Interrupts,
    Rider,
    one_reader,
    wide_cells,
)
from app.runtimes.llama.backend import (
    L,
    claim_threads,
    ensure_backend,
    flash_attn_type,
    release_free_memory,
    release_threads,
)
from app.runtimes.llama.pooled import PooledOutputs
from app.runtimes.llama.sampling import Sampling
from app.runtimes.llama.scoring import PromptScoring
from app.runtimes.llama.slots import CacheShape, CopyCosts, Slots, copy_costs, stream_copy_min
from app.runtimes.llama.speculative import Speculation
from app.runtimes.llama.vision import ImageBatch, open_images, projector_path
from app.runtimes.threads import ThreadTuner
from app.runtimes.worker import NativeLifetime, Sequence, interactive

log = logging.getLogger(__name__)

CACHE_MODES = ("reuse", "exact", "off")
# how long an interactive request's cache stays in place as other requests start (Slots.release):
# an editor sends its next completion within a second or two of typing, continuing the prompt
WARM_S = 2.0
_KV_TYPES = {"f16": 1, "q8_0": 8, "q4_0": 2}  # ggml type ids


class LlamaEngine(Admission, PooledOutputs, PromptScoring, Sampling, Speculation):
    """The native state of one model and the decode loop the worker drives."""

    def __init__(self, model: LocalModel, options: LoadOptions, *, extra_bufts: bool) -> None:
        ensure_backend()
        mp = L.llama_model_default_params()
        # this llama.cpp takes mmap/mlock as one load mode: NONE 0, MMAP 1, MLOCK 2, MMAP_MLOCK 3
        mp.load_mode = (1 if options.use_mmap else 0) | (2 if options.use_mlock else 0)
        if options.gpu_layers >= 0:
            mp.n_gpu_layers = options.gpu_layers
        mp.use_extra_bufts = extra_bufts
        self.model = L.llama_model_load_from_file(model.path.encode(), mp)
        if not self.model:
            raise ModelLoadFailed(f"llama.cpp could not load '{model.id}' ({model.path})")
        self.vocab = L.llama_model_get_vocab(self.model)
        self.n_vocab = L.llama_vocab_n_tokens(self.vocab)
        n_train = L.llama_model_n_ctx_train(self.model)
        n_ctx = options.context_length or 4096
        if n_train > 0:
            n_ctx = min(n_ctx, n_train)
        self.is_embedding = bool(model.extra.get("embedding"))
        self.is_reranker = bool(model.extra.get("reranker"))
        self.cache_mode = options.prompt_cache if options.prompt_cache in CACHE_MODES else "reuse"
        parallel = 1 if self.is_embedding else max(1, options.parallel)
        # kv_layout "shared": one cache of n_ctx cells that the sequences share (llama-server's
        # default), so memory does not grow with `parallel`; more sequence ids than `parallel`
        # keep idle conversations' caches until their cells are needed. "per-sequence" (and
        # always the "exact" prompt cache): a stream of n_ctx cells per sequence, where a
        # step's attention reads only its own cells (and, for "exact", they lie as in a solo
        # run, bit-identical)
        self.unified = not self.is_embedding and not separate_caches(
            self.cache_mode, options.kv_layout
        )
        n_seq = cache_slots(parallel, self.cache_mode) if self.unified else parallel
        cp = L.llama_context_default_params()
        cp.n_ctx = n_ctx if self.unified else n_ctx * parallel
        cp.n_batch = min(options.batch_size, n_ctx)
        cp.n_ubatch = min(options.ubatch_size or options.batch_size, cp.n_batch)
        if self.is_embedding:
            # a whole input is one non-causal batch; pooling as the model says
            cp.embeddings = True
            cp.pooling_type = -1
            cp.n_batch = cp.n_ubatch = n_ctx
        cp.n_seq_max = n_seq
        cp.kv_unified = self.unified
        cp.no_perf = True
        cp.flash_attn_type = flash_attn_type(options.flash_attention)
        cp.type_k = cp.type_v = _KV_TYPES[options.kv_type]
        cp.rope_scaling_type = {"none": -1, "linear": 1, "yarn": 2}[options.rope_scaling]
        if options.rope_freq_base > 0:
            cp.rope_freq_base = options.rope_freq_base
        if options.rope_freq_scale > 0:
            cp.rope_freq_scale = options.rope_freq_scale
        self.default_seed = options.seed
        # "auto": the physical cores, within what other loaded models' threads leave
        generates = not (self.is_embedding or self.is_reranker)
        threads = claim_threads(id(self), options.threads, generates=generates)
        cp.n_threads = cp.n_threads_batch = threads
        self.ctx = L.llama_init_from_model(self.model, cp)
        if not self.ctx:
            release_threads(id(self))
            L.llama_model_free(self.model)
            raise ModelLoadFailed(
                f"llama.cpp could not create a context of {n_ctx} tokens for '{model.id}' (out of memory?)"
            )
        self.n_ctx = L.llama_n_ctx_seq(self.ctx)  # the most one sequence may hold
        self.cache_tokens = L.llama_n_ctx(self.ctx)  # all sequences together
        self.n_batch = L.llama_n_batch(self.ctx)
        self.threads = threads
        # "auto" threads follow the machine's load (runtimes/threads.py); a set count is kept
        self.tuner = ThreadTuner(threads) if not options.threads and threads > 1 else None
        self.mem = L.llama_get_memory(self.ctx)
        self.vision: ImageBatch | None = None
        if projector_path(model):
            try:
                self.vision = open_images(model, options, self, cp.flash_attn_type)
            except Exception:
                release_threads(id(self))
                L.llama_free(self.ctx)
                L.llama_model_free(self.model)
                raise
        self.max_sequences = parallel  # decoded at once; more slots keep idle caches
        # a shared cache attended on the CPU: what a step costs in cells bounds the width
        on_cpu = options.gpu_layers == 0 or not L.llama_supports_gpu_offload()
        self.step_cells = wide_cells(self.model) if self.unified and on_cpu else math.inf
        self.peak_batch = 0  # the most sequences decoded in one step so far
        self.preempted = 0  # sequences parked because the shared cache was full
        self.batch = L.llama_batch_init(self.n_batch, 0, 1)
        self._piece = ctypes.create_string_buffer(256)
        self._aborting: tuple[Sequence, ...] = ()  # a cancel of one of these aborts the decode
        self._abort_cb = L.ggml_abort_callback(self._should_abort)
        self.interrupts = Interrupts(self.ctx)  # an interactive arrival stops a decode
        self._room_freed = False  # cells were freed since a sequence was parked
        self.n_ubatch = n_ubatch = int(L.llama_n_ubatch(self.ctx))
        # a prompt is read a piece a decode (admission.py): each piece is one micro-batch, so
        # a fresh run's pieces start at multiples of it (what the exact cache reuses)
        piece = PROMPT_PIECE_CPU if on_cpu else PROMPT_PIECE
        self.prompt_piece = min(piece, n_ubatch, int(self.n_batch))
        self.prompt_cache = self.cache_mode != "off"
        # prompts that join running streams are read together, one decode a step for all of
        # them (llama-server reads new prompts in one batch); the exact cache reads each as a
        # fresh run would instead
        self.prompts_together = self.cache_mode != "exact"
        # joining prompts share what other slots hold of their prefix (Slots.borrow): one
        # shared "reuse" cache, text prompts
        self.shares_prefixes = self.unified and self.cache_mode == "reuse" and self.vision is None
        # a sequence decoding alone drafts by prompt lookup (speculative.py)
        self.speculative = options.speculative == "ngram" and not self.is_embedding
        shape = CacheShape(
            self.cache_mode, self.unified, self.prompt_piece, int(L.llama_model_n_swa(self.model))
        )
        costs = CopyCosts(
            **copy_costs(self.model, v_transposed=cp.flash_attn_type == 0),
            copy_min=stream_copy_min(self.model, self.n_ctx, KV_BYTES[options.kv_type]),
        )
        self.slots = Slots(
            self.mem, n_seq, shape, ctx=self.ctx, cells=int(self.cache_tokens), costs=costs
        )
        # other threads' calls (tokenize, pieces, grammar checks) hold this; shutdown waits
        self.lifetime = NativeLifetime()
        self.max_token_bytes = max(
            (
                abs(L.llama_token_to_piece(self.vocab, t, self._piece, 256, 0, True))
                for t in range(self.n_vocab)
            ),
            default=1,
        )

    # -- helpers used from any thread (read-only vocab, under the lifetime hold) ------------
    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        raw = text.encode("utf-8")
        cap = len(raw) + 16
        buf = (L.llama_token * cap)()
        with self.lifetime.hold():
            n = L.llama_tokenize(self.vocab, raw, len(raw), buf, cap, add_special, parse_special)
            if n < 0:
                cap = -n
                buf = (L.llama_token * cap)()
                n = L.llama_tokenize(
                    self.vocab, raw, len(raw), buf, cap, add_special, parse_special
                )
        return list(buf[:n])

    def piece(self, token: int, *, special: bool = False) -> bytes:
        with self.lifetime.hold():
            return self._piece_of(token, special)

    def pieces(self, tokens: list[int], *, special: bool = False) -> list[bytes]:
        with self.lifetime.hold():
            return [self._piece_of(t, special) for t in tokens]

    def _piece_of(self, token: int, special: bool) -> bytes:
        buf = ctypes.create_string_buffer(256)
        n = L.llama_token_to_piece(self.vocab, token, buf, 256, 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = L.llama_token_to_piece(self.vocab, token, buf, -n, 0, special)
        return buf.raw[:n]

    def meta(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(4096)
        with self.lifetime.hold():
            n = L.llama_model_meta_val_str(self.model, key.encode(), buf, 4096)
        return buf.value.decode("utf-8", errors="replace") if n >= 0 else None

    def grammar_compiles(self, grammar: str) -> bool:
        """Whether llama.cpp accepts ``grammar`` (compiled once and freed)."""
        with self.lifetime.hold():
            g = L.llama_sampler_init_grammar(self.vocab, grammar.encode(), b"root")
            if not g:
                return False
            L.llama_sampler_free(g)
            return True

    # -- worker thread ----------------------------------------------------------------------
    def _should_abort(self, _data: object) -> bool:
        return any(seq.cancelled for seq in self._aborting)

    def _fill(self, tokens: list[int], start_pos: int, seq_id: int, *, logits_last: bool) -> None:
        n = len(tokens)
        for i, t in enumerate(tokens):
            self._put(i, t, start_pos + i, seq_id, logits=logits_last and i == n - 1)
        self.batch.n_tokens = n

    def _decode(self, batch: Any = None) -> int:
        """llama_decode the batch; when a shared cache has no room, idle caches go first. Each
        of its tokens attended every idle cell in place: charged to those caches."""
        b = self.batch if batch is None else batch
        while True:
            rc = L.llama_decode(self.ctx, b)
            if rc != 1 or not self.unified or not self.slots.evict_idle():
                break
        if rc == 0 and self.slots.stash_cells:
            self.slots.charge(int(b.n_tokens))
        return rc

    def _park(self, st: _SeqState) -> None:
        """Free a sequence's cells for the others (the shared cache is full); it reads its
        tokens again when room is freed. A generating sequence's pending token is the last of
        them, so its next token comes from the same place."""
        if st.ready:
            st.prompt = list(self.slots.kv[st.slot])
        self.slots.forget(st.slot)
        st.done_upto = 0
        st.ready = False
        st.parked = True
        self.preempted += 1

    def begin(self, seq: Sequence) -> None:
        self.watch_cancel(seq)
        req: GenerationRequest = seq.request
        tokens = list(req.prompt_tokens)
        if len(tokens) >= self.n_ctx:
            raise ValueError("prompt does not fit the context")
        slot = self.slots.take(tokens, cool=interactive(req))
        # the constraint's grammar was converted and checked before the request was queued
        # (LlamaCppModel.check_constraint): its conversion never runs on this thread
        grammar = seq.prepared if isinstance(seq.prepared, str) else None
        if req.constraint is not None and grammar is None:
            self.slots.free.append(slot)
            raise ValueError("the output constraint's grammar was not prepared")
        try:
            sampler = self._sampler(req.sampling, grammar, req.prompt_tokens)
        except (ValueError, InvalidRequest):
            self.slots.free.append(slot)
            raise
        state = _SeqState(slot, sampler)
        seq.engine_state = state
        cached = self.slots.reuse(slot, tokens)
        seq.cached = cached
        state.prompt, state.done_upto = tokens, cached
        # idle caches that would leave soon anyway go now, so this sequence's cells go low
        if self.slots.stash_cells:
            self.slots.stash_idle(upcoming=len(tokens) - cached, answer=self._answer_room(req))
        # read a piece a step from the next step on (alone or not), so a request that comes
        # meanwhile waits for one piece: after the running streams' step, with the other
        # joining prompts, or in a decode of its own (exact mode, whose pieces must lie as a
        # fresh run's)

    def _busy(self) -> int:
        return self.slots.busy()

    def _prefill(self, seq: Sequence, st: _SeqState) -> None:
        """Read the next piece of the prompt from ``st.done_upto`` (``prompt_piece`` tokens, or
        an image's positions); the rest in the next steps, so a request that arrives meanwhile
        joins within one piece (admission.py). The pieces start where a fresh run's do, so the
        numbers are the same however the prompt was reached."""
        tokens, slot = st.prompt, st.slot
        if seq.cancelled:
            return
        start = st.done_upto
        chunk, batch = self._segment(seq, tokens, start, slot)
        kind = "piece" if tokens[start] >= 0 else ""  # an image's positions run to their end
        with self._abortable((seq,), int(batch.n_tokens), interruptible=kind):
            rc = self._decode(batch)
        if self._interrupted(rc, (seq,)):  # read again after the interactive request
            return
        if rc == 1 and self._busy() > 1:  # the others hold the shared cache: wait
            self._park(st)
            return
        if rc == 2 or seq.cancelled:  # aborted: what this piece wrote is unknown
            self.slots.forget(slot)
            st.failed = True
            return
        if rc != 0:
            self.slots.forget(slot)
            st.failed = True
            raise RuntimeError(f"llama_decode failed on the prompt (code {rc})")
        self.slots.append(slot, chunk)
        st.done_upto = start + len(chunk)
        if st.done_upto < len(tokens):
            self._prompt_time_out(seq)
            return
        # whole micro-batches of the prompt: what a later prompt may reuse exactly
        self.slots.computed_whole(slot, len(tokens))
        self._prompt_read(seq, st, st.last_rows - 1)

    def _prompt_read(self, seq: Sequence, st: _SeqState, row: int) -> None:
        """The whole prompt is in the cache: sample its first token from batch row ``row``."""
        st.pos = len(st.prompt)
        st.ready = True
        if st.parked:  # read again after a park: its pending token's logits are fresh
            st.parked = False
        else:
            seq.t_prompt_done = time.perf_counter()
        self._sample(seq, st, row)

    def _segment(
        self, seq: Sequence, tokens: list[int], start: int, slot: int
    ) -> tuple[list[int], Any]:
        """The next prompt piece from ``start`` in a filled batch: text tokens up to an image
        (or n_batch), or an image's positions as embeddings (app/runtimes/llama/vision.py)."""
        st: _SeqState = seq.engine_state  # type: ignore[assignment]
        if self.vision is not None and tokens[start] < 0:
            n = self.vision.fill(tokens, seq.request.images, start, slot)
            st.last_rows = n
            return tokens[start : start + min(n, self.n_batch)], self.vision.batch
        chunk = self._text_piece(tokens, start, self.prompt_piece)
        self._fill(chunk, start, slot, logits_last=start + len(chunk) == len(tokens))
        st.last_rows = len(chunk)
        return chunk, self.batch

    def _sample(self, seq: Sequence, st: _SeqState, idx: int) -> None:
        """Pick the next token from the logits the last decode left at row ``idx``. Done right
        after each decode: the next one (another sequence's prompt) overwrites the logits."""
        tok = L.llama_sampler_sample(st.sampler, self.ctx, idx)
        st.next = tok
        if L.llama_vocab_is_eog(self.vocab, tok):
            seq.finish("stop")
            return
        k = L.llama_token_to_piece(self.vocab, tok, self._piece, 256, 0, False)
        raw = self._piece.raw[:k] if k >= 0 else self._piece_of(tok, False)
        lp = seq.request.logprobs
        entry = (self._logprob(idx, tok, raw, lp),) if lp is not None else ()
        # sent now, not at the next step: the worker hands it to the client before the next
        # decode (a first token used to wait for the second one's decode, ~10 ms of TTFT)
        seq.emit_text(st.decoder.decode(raw), 1, entry)

    def step(self, seqs: list[Sequence]) -> None:
        """Decode each sequence's sampled (already sent) token in one batch; sample and send
        the next ones; then read the next pieces of the prompts that are joining. Nothing when
        an interactive request just arrived: the worker admits it first (admission.py, Interrupts)."""
        if self.interrupts.waiting:
            return
        decoded: list[tuple[Sequence, _SeqState]] = []
        reading: list[tuple[Sequence, _SeqState]] = []
        for seq in seqs:
            st: _SeqState = seq.engine_state  # type: ignore[assignment]
            if not st.ready and not st.failed and not seq.cancelled and st.prompt:
                reading.append((seq, st))  # its prompt is still being read (or it is parked)
                continue
            if not st.ready or st.next is None:
                seq.finish("cancelled" if seq.cancelled else "error")
                continue
            tok, st.next = st.next, None  # sampled and sent (_sample); now decoded
            if seq.finish_reason is not None:
                continue
            if st.pos + 1 >= self.n_ctx:
                seq.finish("length")
                continue
            self.slots.append(st.slot, [tok])
            decoded.append((seq, st))
        if not self.unified:  # a multi-stream cache batches only consecutive sequence ids
            decoded.sort(key=lambda d: d[1].slot)
        if self.speculative and len(decoded) == 1 and not reading and self._speculate(*decoded[0]):
            return
        # prompts whose last piece is small enough ride in the streams' decode (admission.py);
        # an interactive one's is read first, in a decode of its own
        riders = self._riders(decoded, reading) if decoded and self.shares_prefixes else []
        riders = self._read_ahead(riders, seqs)
        while decoded:
            rows = len(decoded) + sum(len(r[2]) for r in riders)
            with self._abortable((), rows, interruptible="step"):
                rc = self._decode_step(decoded, riders)
            if rc == 0:
                break
            if self._interrupted(rc, ()):  # an interactive request is read first: again then
                for _, st in decoded:
                    st.next = self.slots.kv[st.slot][-1]
                    self.slots.take_back(st.slot, 1)
                return
            if riders:  # no room for them too: they read their pieces after the step
                riders = []
                continue
            # the shared cache is full: the youngest sequence holding cells waits
            holders = decoded + [r for r in reading if r[1].done_upto]  # parked: none
            if rc == 1 and len(holders) > 1:
                victim = max(holders, key=lambda d: d[0].t_start)
                if victim in decoded:
                    decoded.remove(victim)
                self._park(victim[1])
                continue
            self._fail(seqs, rc)
        n = len(decoded)
        for i, (seq, st) in enumerate(decoded):
            self._decoded(seq, st, n)
            self._sample(seq, st, i)
        if riders:
            self._rode(riders, n)
        reading = [r for r in reading if not r[1].ready]  # the riders' prompts are read
        room = self._room_freed
        self._room_freed = False
        # a parked sequence reads again only once something freed cells (one already reading
        # again goes on)
        joining = [r for r in reading if not (r[1].parked and decoded and not r[1].done_upto
                                             and not room)]  # fmt: skip
        if joining and (decoded or riders):
            # the tokens just picked go out before the pieces are read: a rider's first token
            # (an editor's keystroke) waited for a piece of an agent's prompt (~0.3 s on 2 cores)
            seqs[0].deliver(first=bool(riders))
        if self.shares_prefixes:
            for seq, st in joining:
                self._borrow(seq, st)
            joining = one_reader(joining)
        if self.prompts_together and len(joining) > 1 and self._read_together(joining):
            joining = [r for r in joining if self.vision is not None and not r[1].ready
                       and r[1].prompt[r[1].done_upto] < 0]  # fmt: skip
        for seq, st in joining:  # one piece of each prompt being read (an image: always)
            if self.interrupts.waiting:  # an interactive request waits: it goes first
                break
            self._prefill(seq, st)

    def _borrow(self, seq: Sequence, st: _SeqState) -> None:
        """Before its next piece: what other sequences already read of the prompt's prefix
        is shared into its slot (Slots.borrow), so a burst of prompts with a common start
        reads it once. A parked sequence waits for room as it is."""
        if st.parked or st.ready:
            return
        have = self.slots.borrow(st.slot, st.prompt, st.done_upto)
        if have > st.done_upto:
            st.done_upto = have
            seq.cached = max(seq.cached, have)

    def _put(self, i: int, token: int, pos: int, slot: int, *, logits: bool) -> None:
        b = self.batch
        b.token[i] = token
        b.pos[i] = pos
        b.n_seq_id[i] = 1
        b.seq_id[i][0] = slot
        b.logits[i] = int(logits)

    def _decoded(self, seq: Sequence, st: _SeqState, n_seqs: int) -> None:
        """Its pending token is in the cache now, decoded in a step of ``n_seqs`` sequences."""
        st.pos += 1
        seq.batch_sum += n_seqs
        seq.batch_steps += 1
        seq.threads = self.threads
        seq.cpu_busy = self.tuner is not None and self.threads < self.tuner.max_threads

    def _fail(self, seqs: list[Sequence], rc: int) -> None:
        for seq in seqs:
            if isinstance(seq.engine_state, _SeqState):
                self.slots.forget(seq.engine_state.slot)
        raise RuntimeError(f"llama_decode failed (code {rc})")

    def _decode_step(
        self, decoded: list[tuple[Sequence, _SeqState]], riders: list[Rider] | None = None
    ) -> int:
        """One decode of each sequence's last token, and of the riders' last prompt pieces
        after them; returns llama_decode's code."""
        for i, (_, st) in enumerate(decoded):
            self._put(i, self.slots.kv[st.slot][-1], st.pos, st.slot, logits=True)
        n = len(decoded)
        for _, st, chunk in riders or ():
            for j, t in enumerate(chunk):
                self._put(n + j, t, st.done_upto + j, st.slot, logits=j == len(chunk) - 1)
            n += len(chunk)
        self.batch.n_tokens = n
        self.peak_batch = max(self.peak_batch, len(decoded) + len(riders or ()))
        t0 = time.perf_counter()
        rc = self._decode()
        if rc == 0 and self.tuner is not None and not riders:  # a step of the streams alone
            # what a step attends over: its own cells, or in a shared cache all used cells
            # (8 growing streams slowed their steps by a third within one context bucket of
            # the longest, read as contention)
            kv = self.slots.kv
            context = sum(map(len, kv)) if self.unified else max(st.pos for _, st in decoded)
            self._tune(self.tuner, time.perf_counter() - t0, n, context)
        return rc

    def _tune(self, tuner: ThreadTuner, seconds: float, batch: int, context: int) -> None:
        """Feed one decode step's time to the tuner; apply the thread count it picks."""
        threads = tuner.observe(seconds, batch, context)
        if threads is not None and threads != self.threads:
            L.llama_set_n_threads(self.ctx, threads, threads)
            log.info(
                "decoding with %d of %d threads: %s",
                threads,
                tuner.max_threads,
                "the CPU is busy with other programs"
                if threads < tuner.max_threads
                else "the CPU is free again",
            )
            self.threads = threads

    def end(self, seq: Sequence) -> None:
        st = seq.engine_state
        if isinstance(st, _SeqState):
            L.llama_sampler_free(st.sampler)
            # its cells stay in place: the others' steps pay for them until that adds up to the
            # cost of copying them to host memory (Slots.charge); an interactive request's for
            # WARM_S whatever starts meanwhile (an editor's next keystroke continues it)
            warm = WARM_S if interactive(seq.request) else 0.0
            self.slots.release(st.slot, keep=self.prompt_cache and not st.parked, warm=warm)
            self._room_freed = True
            seq.engine_state = None

    def shutdown(self) -> None:
        self.lifetime.retire()  # no other thread is inside the model from here on
        self.slots.clear_stash()
        if self.vision is not None:  # the projector holds the model: it goes first
            self.vision.close()
            self.vision = None
        if self.batch is not None:
            L.llama_batch_free(self.batch)
            self.batch = None
        if self.ctx:
            L.llama_free(self.ctx)
            self.ctx = None
            release_threads(id(self))
        if self.model:
            L.llama_model_free(self.model)
            self.model = None
        release_free_memory()


class _SeqState:
    __slots__ = (
        "slot",
        "sampler",
        "pos",
        "next",
        "ready",
        "failed",
        "prompt",
        "done_upto",
        "decoder",
        "parked",
        "last_rows",
        "drafts",
    )

    def __init__(self, slot: int, sampler: Any) -> None:
        self.slot = slot
        self.sampler = sampler
        self.prompt: list[int] = []
        self.done_upto = 0  # prompt tokens already in the cache
        self.failed = False
        self.pos = 0
        self.next: int | None = None  # the token sampled (and sent) after the last decode
        self.ready = False
        self.parked = False  # its cells were freed for others; it reads its tokens again
        self.last_rows = 0  # rows in the last prompt batch (its last one's logits are sampled)
        self.drafts: Any = None  # its n-gram index, once it decodes alone (speculative.Drafts)
        # holds back an incomplete UTF-8 character until its last byte arrives
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
