"""In-process MLX models through mlx-lm (Metal on Apple silicon, the CPU elsewhere).

Same contract as the llama.cpp runtime: one worker thread owns the model, requests queue in
order, a cancelled request stops within one token (and between prompt chunks while the prompt is
processed), errors come back through the stream.
"""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path
from typing import Any

from app.core.inference.images import ImageInput
from app.core.types import (
    Constraint,
    GenerationRequest,
    LoadOptions,
    LocalModel,
    SamplingParams,
    TokenLogprob,
)
from app.errors import InvalidModel, ModelLoadFailed, RuntimeUnavailable, UnsupportedParameter
from app.runtimes.grammar.compile_pool import COMPILE_POOL
from app.runtimes.grammar.guidance import Guide
from app.runtimes.mlx.vision import VisionModel, is_vision_config, vlm_available
from app.runtimes.worker import DeltaStream, Sequence, Worker, common_prefix

log = logging.getLogger(__name__)

PREFILL_STEP = 512  # prompt chunk: the granularity of cancelling during prompt processing
PENALTY_CONTEXT = 64  # tokens of history the repetition/presence/frequency penalties look at


WARM_JOIN_S = 60.0  # closing waits this long for the grammar warm-up to end


class _Cancelled(Exception):
    pass


def _import_mlx() -> tuple[Any, Any, Any, Any]:
    try:
        import mlx.core as mx
        from mlx_lm.generate import generate_step
        from mlx_lm.models import cache as mlx_cache
        from mlx_lm.sample_utils import make_logits_processors, make_sampler
        from mlx_lm.utils import load as mlx_load
    except ImportError as e:
        raise RuntimeUnavailable(
            "MLX is not installed here (pip install 'hearth[mlx]': mlx-lm, and mlx[cpu] on Linux)"
        ) from e
    return mx, generate_step, (make_sampler, make_logits_processors, mlx_cache), mlx_load


class MlxEngine:
    """mlx-lm's generate_step driven one token per worker step."""

    max_sequences = 1

    def __init__(self, model: LocalModel, options: LoadOptions) -> None:
        mx, self._generate_step, samplers, mlx_load = _import_mlx()
        self._mx = mx
        self._make_sampler, self._make_processors, self._cache_mod = samplers
        # MLX models decode one request at a time here: `parallel` is how many may wait in
        # line together, not a batch (the load default of 4 applies to every format)
        path = Path(model.path)
        cfg = _read_json(path / "config.json")
        if cfg.get("auto_map") or (path / "modeling.py").exists():
            raise InvalidModel(
                f"'{model.id}' needs custom code (trust_remote_code); Hearth never runs it"
            )
        # an mlx-vlm folder (a vision tower in its config) loads through mlx-vlm when it is
        # here; its language model is then driven like any other (app/runtimes/mlx/vision.py)
        self.vision: VisionModel | None = None
        self.model: Any = None
        raw_text = cfg.get("text_config")
        text_cfg: dict[str, Any] = raw_text if isinstance(raw_text, dict) else {}
        if is_vision_config(cfg) and vlm_available():
            from mlx_lm.utils import load_tokenizer

            self.vision = VisionModel(path, model.id)
            self.model = self.vision.language
            eos = cfg.get("eos_token_id", text_cfg.get("eos_token_id"))
            eos_ids = [eos] if isinstance(eos, int) else eos if isinstance(eos, list) else None
            try:
                self.tokenizer = load_tokenizer(path, eos_token_ids=eos_ids)
            except (ValueError, OSError, KeyError) as e:
                raise ModelLoadFailed(
                    f"mlx-lm could not load the tokenizer of '{model.id}': {e}"
                ) from e
        else:
            try:
                self.model, self.tokenizer = mlx_load(str(path))
            except (ValueError, OSError, KeyError) as e:
                hint = " (a vision model: install mlx-vlm)" if is_vision_config(cfg) else ""
                raise ModelLoadFailed(f"mlx-lm could not load '{model.id}'{hint}: {e}") from e
        trained = int(
            cfg.get("max_position_embeddings") or text_cfg.get("max_position_embeddings") or 4096
        )
        self.n_ctx = min(options.context_length or 4096, trained)
        self.seed = options.seed
        self._stream: Any = None
        # Prompt-prefix reuse, as in the llama.cpp runtime: the cache of the last prompt (and
        # its answer) is kept. "reuse" continues from the whole common prefix; "exact" reuses
        # only whole prefill chunks (PREFILL_STEP tokens, aligned from the start), which a
        # fresh run computes the same way, so answers do not change; "off" keeps nothing.
        self.cache_mode = options.prompt_cache
        self.prompt_cache = options.prompt_cache != "off"
        self._cache: list[Any] | None = None
        self._cache_tokens: list[int] = []
        self._exact = 0
        # UTF-8 length of the longest vocabulary entry (byte-level BPE spells a byte as one
        # or two characters, so this never underestimates a token's bytes)
        self.max_token_bytes = max(
            (len(t.encode()) for t in self.tokenizer._tokenizer.get_vocab()), default=1
        )
        self.guide = Guide(
            self.tokenizer._tokenizer,
            n_vocab=max(
                int(cfg.get("vocab_size") or text_cfg.get("vocab_size") or 0),
                len(self.tokenizer._tokenizer),
            ),
            eos_tokens=sorted(int(t) for t in self.tokenizer.eos_token_ids),
        )

    # -- helpers --------------------------------------------------------------------------
    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        tok = self.tokenizer._tokenizer  # the HF tokenizer the wrapper forwards to
        return list(tok.encode(text, add_special_tokens=add_special))

    # -- worker thread ----------------------------------------------------------------------
    def _reuse(self, tokens: list[int]) -> tuple[list[Any], int]:
        """The KV cache to continue from and how many of ``tokens`` it already holds."""
        cm = self._cache_mod
        cache, keep = self._cache, 0
        self._cache = None  # taken: put back only when the generation ends cleanly
        if cache is not None and self.prompt_cache and cm.can_trim_prompt_cache(cache):
            common = min(common_prefix(self._cache_tokens, tokens), len(tokens) - 1)
            keep = common
            if self.cache_mode == "exact":
                keep = min(common, self._exact)
                keep -= keep % PREFILL_STEP
            held = int(cache[0].offset)
            if keep > 0 and cm.trim_prompt_cache(cache, held - keep) != held - keep:
                keep = 0
        if cache is None or keep == 0:
            cache = cm.make_prompt_cache(self.model)
        self._cache_tokens = tokens[:keep]
        self._exact = keep
        return cache, keep

    def begin(self, seq: Sequence) -> None:
        mx = self._mx
        if self._stream is None:  # MLX streams belong to the thread that made them
            self._stream = mx.new_stream(mx.default_device())
        req: GenerationRequest = seq.request
        s: SamplingParams = req.sampling
        seed = s.seed if s.seed is not None else self.seed
        if seed is not None:
            mx.random.seed(seed & 0xFFFFFFFF)
        sampler = self._make_sampler(
            temp=max(0.0, s.temperature),
            top_p=s.top_p if s.top_p < 1.0 else 0.0,
            min_p=s.min_p,
            top_k=s.top_k,
        )
        processors = self._make_processors(
            logit_bias=dict(s.logit_bias) or None,
            repetition_penalty=s.repeat_penalty if s.repeat_penalty != 1.0 else None,
            presence_penalty=s.presence_penalty or None,
            frequency_penalty=s.frequency_penalty or None,
            repetition_context_size=PENALTY_CONTEXT,
            presence_context_size=PENALTY_CONTEXT,
            frequency_context_size=PENALTY_CONTEXT,
        )
        tokens = list(req.prompt_tokens)
        cache, cached = self._reuse(tokens)
        embeddings, real = self._embeddings(tokens, req.images, cached)
        if embeddings is not None and cached and self.vision and self.vision.language.positional:
            # positions came with the embeddings (M-RoPE): computed from the start
            cache, cached = self._cache_mod.make_prompt_cache(self.model), 0
            self._cache_tokens, self._exact = [], 0
        seq.cached = cached
        if processors and cached:
            # mlx-lm shows processors only the tokens it was given: put back the cached
            # prompt's tail, so penalties see the same history as in an uncached run
            head = mx.array(real[max(0, cached - PENALTY_CONTEXT) : cached])
            processors = [_with_history(p, head, mx) for p in processors]

        def progress(done: int, total: int) -> None:
            if seq.cancelled:
                raise _Cancelled

        if req.constraint is not None:  # first, so penalties and bias see only valid tokens
            processors = [self.guide.matcher(req.constraint), *(processors or [])]

        remaining = self.n_ctx - len(req.prompt_tokens)
        limit = remaining if req.max_tokens is None else min(req.max_tokens, remaining)
        gen = self._generate_step(
            mx.array(real[cached:]),
            self.model,
            prompt_cache=cache,
            stream=self._stream,
            max_tokens=limit,
            sampler=sampler,
            logits_processors=processors,
            prefill_step_size=PREFILL_STEP,
            prompt_progress_callback=progress,
            input_embeddings=embeddings[cached:] if embeddings is not None else None,
        )
        detok = self.tokenizer.detokenizer
        detok.reset()
        state = _MlxState(gen, detok, limit, tokens)
        seq.engine_state = state
        # the first next() processes the whole prompt (cancellable between chunks)
        try:
            state.pending = next(gen)
        except _Cancelled:
            state.done = True
            return  # the cache holds part of a prompt: it is dropped
        except StopIteration:
            state.done = True
            return
        # whole prefill chunks of this prompt (its last token is computed with the first step)
        n = len(tokens) - 1
        self._cache, self._cache_tokens, self._exact = cache, tokens, n - n % PREFILL_STEP

    def _embeddings(
        self, tokens: list[int], images: tuple[ImageInput, ...], cached: int
    ) -> tuple[Any, list[int]]:
        """The prompt's merged input embeddings when its uncached part holds image positions
        (else None: mlx-lm embeds the tokens), and its token ids with images as the model's
        image token (what the penalties see)."""
        vision = self.vision
        if vision is None or not any(t < 0 for t in tokens):
            if any(t < 0 for t in tokens):
                raise UnsupportedParameter("this model does not take images", param="messages")
            return None, tokens
        real = vision.real_ids(tokens)
        if not any(t < 0 for t in tokens[cached:]):
            return None, real  # the images are in the cache already
        with self._mx.stream(self._stream):
            return vision.embeddings(self._mx, tokens, images), real

    def step(self, seqs: list[Sequence]) -> None:
        for seq in seqs:
            st: _MlxState = seq.engine_state  # type: ignore[assignment]
            if st.done or st.pending is None:
                seq.finish("cancelled" if seq.cancelled else "length")
                continue
            token = st.pending[0]
            tok = int(token.item() if hasattr(token, "item") else token)
            st.tokens.append(tok)
            if tok in self.tokenizer.eos_token_ids:
                seq.finish("stop")
                continue
            st.detok.add_token(tok)
            lp = seq.request.logprobs
            entry = (self._logprob(st.pending[1], tok, lp),) if lp is not None else ()
            seq.emit_text(st.detok.last_segment, 1, entry)
            st.produced += 1
            if seq.finish_reason is not None:
                continue
            if st.produced >= st.limit:
                seq.finish("length")
                continue
            try:
                st.pending = next(st.gen)
            except StopIteration:
                seq.finish("length")

    def _logprob(self, logprobs: Any, tok: int, top_n: int) -> TokenLogprob:
        mx = self._mx
        hf = self.tokenizer._tokenizer

        def text(t: int) -> str:
            return str(hf.decode([t]))

        top: tuple[tuple[str, float, tuple[int, ...]], ...] = ()
        if top_n > 0:
            ids = mx.argsort(-logprobs)[:top_n].tolist()
            top = tuple(
                (text(i), _finite(logprobs[i].item()), tuple(text(i).encode())) for i in ids
            )
        s = text(tok)
        return TokenLogprob(s, _finite(logprobs[tok].item()), tuple(s.encode()), top)

    def end(self, seq: Sequence) -> None:
        st = seq.engine_state
        if isinstance(st, _MlxState):
            st.gen.close()
            seq.engine_state = None
            if self._cache is not None and self.cache_mode == "reuse":
                # the cache holds the prompt and the answer mlx-lm fed back: all reusable
                held = int(self._cache[0].offset)
                if held <= len(st.tokens):
                    self._cache_tokens = st.tokens[:held]
                else:
                    self._cache = None
        if seq.error is not None or seq.finish_reason == "error" or not self.prompt_cache:
            self._cache = None  # a failed step may have left the layers' caches uneven
        if self.vision is not None and self.vision.language.positional:
            self._cache = None  # M-RoPE positions: never continued from (vision.py)
            self.vision.language.extra = {}

    def shutdown(self) -> None:
        if self.vision is not None:
            self.vision.close()
        self.model = None
        self.tokenizer = None


MIN_LOGPROB = -9999.0  # OpenAI's "very unlikely"; JSON has no -Infinity


def _finite(logprob: float) -> float:
    """A token the grammar forbids has logprob -inf (the mask comes before mlx-lm's softmax)."""
    return float(logprob) if logprob > MIN_LOGPROB else MIN_LOGPROB


def _with_history(processor: Any, head: Any, mx: Any) -> Any:
    def run(tokens: Any, logits: Any) -> Any:
        return processor(mx.concatenate([head, tokens]), logits)

    return run


class _MlxState:
    __slots__ = ("gen", "detok", "pending", "done", "produced", "limit", "tokens")

    def __init__(self, gen: Any, detok: Any, limit: int, tokens: list[int]) -> None:
        self.gen = gen
        self.tokens = list(tokens)  # the prompt, then each token mlx-lm gave (and so fed)
        self.detok = detok
        self.pending: Any = None
        self.done = False
        self.produced = 0
        self.limit = limit


class MlxModel:
    """A loaded MLX model: the LoadedModel protocol over a worker thread."""

    def __init__(self, model: LocalModel, engine: MlxEngine, *, queue_size: int) -> None:
        self.model_id = model.id
        self.engine = engine
        self.context_length = engine.n_ctx
        self.cache_tokens = engine.n_ctx
        self.parallel = engine.max_sequences
        tok = engine.tokenizer
        self._template = model.chat_template or getattr(tok, "chat_template", None)
        self._special: dict[str, Any] = {
            "bos": getattr(tok, "bos_token", None) or "",
            "eos": getattr(tok, "eos_token", None) or "",
            "bos_id": getattr(tok, "bos_token_id", None),
            "eos_id": getattr(tok, "eos_token_id", None),
            "n_vocab": len(tok._tokenizer),
            "pad": getattr(tok, "pad_token", None) or "",
            "pad_id": getattr(tok, "pad_token_id", None),
            "unk": getattr(tok, "unk_token", None) or "",
            "unk_id": getattr(tok, "unk_token_id", None),
            "tokenizer_model": type(tok._tokenizer).__name__,
            "add_bos": bool(getattr(tok._tokenizer, "add_bos_token", False)),
            "add_eos": bool(getattr(tok._tokenizer, "add_eos_token", False)),
        }
        self.worker = Worker(engine, name=model.id, queue_size=queue_size)
        self._good_constraints: set[tuple[str, str]] = set()
        self.warm_thread: threading.Thread | None = None  # the grammar warm-up (see load)

    @property
    def chat_template(self) -> str | None:
        return self._template

    @property
    def special_tokens(self) -> dict[str, Any]:
        return self._special

    @property
    def capabilities(self) -> frozenset[str]:
        if self.engine.vision is not None:
            return frozenset({"completion", "chat", "vision"})
        return frozenset({"completion", "chat"})

    async def tokenize_images(self, text: str, images: tuple[ImageInput, ...]) -> list[int]:
        """The rendered prompt's tokens with each image's positions (its pseudo-tokens), by
        mlx-vlm's processor on the worker thread, which owns the model."""
        vision = self.engine.vision
        if vision is None:
            raise UnsupportedParameter(
                f"'{self.model_id}' does not take images (a vision model needs mlx-vlm)",
                param=images[0].where or "messages",
            )
        return await self.worker.run(lambda _cancelled: vision.tokenize(text, images))

    @property
    def pending(self) -> int:
        return self.worker.pending

    @property
    def queue_full(self) -> bool:
        return self.worker.queue_full

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        return self.engine.tokenize(text, add_special=add_special, parse_special=parse_special)

    def detokenize(self, tokens: list[int]) -> str:
        return str(self.engine.tokenizer._tokenizer.decode(tokens))

    def token_pieces(self, tokens: list[int]) -> list[str]:
        return [str(p) for p in self.engine.tokenizer._tokenizer.convert_ids_to_tokens(tokens)]

    @property
    def max_token_bytes(self) -> int:
        return self.engine.max_token_bytes

    def submit(self, request: GenerationRequest) -> DeltaStream:
        return self.worker.submit(request)

    async def check_constraint(self, constraint: Constraint) -> None:
        """Compile the constraint with llguidance on a compile thread (not the event loop, nor
        this model's worker, whose streams would stall), so one that cannot be enforced is a
        400 before any output."""
        if constraint not in self._good_constraints:
            await COMPILE_POOL.run(lambda _stop: self._check(constraint))

    def _check(self, constraint: Constraint) -> None:
        self.engine.guide.check(constraint)
        if len(self._good_constraints) > 256:
            self._good_constraints.clear()
        self._good_constraints.add(constraint)

    async def embed(self, inputs: list[list[int]]) -> list[list[float]]:
        raise InvalidModel("mlx-lm has no embedding models; use a GGUF embedding model")

    async def rank(self, query: list[int], documents: list[list[int]]) -> tuple[list[float], int]:
        raise InvalidModel("mlx-lm has no reranker models; use a GGUF cross-encoder")

    def close(self) -> None:
        self.worker.close()
        if self.warm_thread is not None:
            self.warm_thread.join(WARM_JOIN_S)


class MlxRuntime:
    """Loads MLX model folders (config.json + *.safetensors + tokenizer) in process."""

    name = "mlx"
    formats = ("mlx",)

    def __init__(self, *, queue_size: int = 16) -> None:
        self.queue_size = queue_size

    def available(self) -> bool:
        try:
            _import_mlx()
        except RuntimeUnavailable:
            return False
        return True

    def system_report(self) -> dict[str, Any]:
        """Whether MLX can load models here, and why not (the doctor)."""
        try:
            _import_mlx()
        except RuntimeUnavailable as e:
            return {"mlx": {"available": False, "reason": e.message}}
        except Exception as e:  # mlx installed but broken (a missing native library)
            return {"mlx": {"available": False, "reason": f"mlx failed to import: {e}"}}
        return {"mlx": {"available": True, "reason": ""}}

    def load(self, model: LocalModel, options: LoadOptions) -> MlxModel:
        engine = MlxEngine(model, options)
        # not a daemon, and joined on close: a daemon thread still inside native code
        # (llguidance, mlx) when the interpreter exits aborts the process ("terminate called
        # without an active exception", seen in a child that exited right after a load)
        warm = threading.Thread(target=engine.guide.warm, name="mlx-guide-warm")
        warm.start()
        log.info("mlx: %s loaded (ctx %d)", model.id, engine.n_ctx)
        lm = MlxModel(model, engine, queue_size=self.queue_size)
        lm.warm_thread = warm
        return lm


def _read_json(p: Path) -> dict[str, Any]:
    try:
        data = json.loads(p.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
