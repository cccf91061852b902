"""In-process MLX models through mlx-lm (Metal on Apple silicon, the CPU elsewhere).

Same contract as the llama.cpp runtime: one worker thread owns the model, requests queue in
order, a cancelled request stops within one token (and between prompt chunks while the prompt is
processed), errors come back through the stream.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from app.core.types import GenerationRequest, LoadOptions, LocalModel, SamplingParams, TokenLogprob
from app.errors import InvalidModel, ModelLoadFailed, RuntimeUnavailable
from app.runtimes.guidance import Guide
from app.runtimes.worker import DeltaStream, Sequence, Worker

log = logging.getLogger(__name__)

PREFILL_STEP = 512  # prompt chunk: the granularity of cancelling during prompt processing


class _Cancelled(Exception):
    pass


def _import_mlx() -> tuple[Any, Any, Any, Any]:
    try:
        import mlx.core as mx
        from mlx_lm.generate import generate_step
        from mlx_lm.sample_utils import make_logits_processors, make_sampler
        from mlx_lm.utils import load as mlx_load
    except ImportError as e:
        raise RuntimeUnavailable(
            "MLX is not installed here (pip install 'hearth[mlx]': mlx-lm, and mlx[cpu] on Linux)"
        ) from e
    return mx, generate_step, (make_sampler, make_logits_processors), mlx_load


class MlxEngine:
    """mlx-lm's generate_step driven one token per worker step."""

    max_sequences = 1

    def __init__(self, model: LocalModel, options: LoadOptions) -> None:
        mx, self._generate_step, samplers, mlx_load = _import_mlx()
        self._mx = mx
        self._make_sampler, self._make_processors = samplers
        path = Path(model.path)
        cfg = _read_json(path / "config.json")
        if cfg.get("auto_map") or (path / "modeling.py").exists():
            raise InvalidModel(
                f"'{model.id}' needs custom code (trust_remote_code); Hearth never runs it"
            )
        try:
            self.model, self.tokenizer = mlx_load(str(path))
        except (ValueError, OSError, KeyError) as e:
            raise ModelLoadFailed(f"mlx-lm could not load '{model.id}': {e}") from e
        trained = int(cfg.get("max_position_embeddings") or 4096)
        self.n_ctx = min(options.context_length or 4096, trained)
        self.seed = options.seed
        self._stream: Any = None
        self.guide = Guide(
            self.tokenizer._tokenizer,
            n_vocab=max(int(cfg.get("vocab_size") or 0), len(self.tokenizer._tokenizer)),
            eos_tokens=sorted(int(t) for t in self.tokenizer.eos_token_ids),
        )

    # -- helpers --------------------------------------------------------------------------
    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        tok = self.tokenizer._tokenizer  # the HF tokenizer the wrapper forwards to
        return list(tok.encode(text, add_special_tokens=add_special))

    # -- worker thread ----------------------------------------------------------------------
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
            repetition_context_size=64,
            presence_context_size=64,
            frequency_context_size=64,
        )

        def progress(done: int, total: int) -> None:
            if seq.cancelled:
                raise _Cancelled

        if req.constraint is not None:  # first, so penalties and bias see only valid tokens
            processors = [self.guide.matcher(req.constraint), *(processors or [])]

        remaining = self.n_ctx - len(req.prompt_tokens)
        limit = remaining if req.max_tokens is None else min(req.max_tokens, remaining)
        gen = self._generate_step(
            mx.array(list(req.prompt_tokens)),
            self.model,
            stream=self._stream,
            max_tokens=limit,
            sampler=sampler,
            logits_processors=processors,
            prefill_step_size=PREFILL_STEP,
            prompt_progress_callback=progress,
        )
        detok = self.tokenizer.detokenizer
        detok.reset()
        state = _MlxState(gen, detok, limit)
        seq.engine_state = state
        # the first next() processes the whole prompt (cancellable between chunks)
        try:
            state.pending = next(gen)
        except _Cancelled:
            state.done = True
        except StopIteration:
            state.done = True

    def step(self, seqs: list[Sequence]) -> None:
        for seq in seqs:
            st: _MlxState = seq.engine_state  # type: ignore[assignment]
            if st.done or st.pending is None:
                seq.finish("cancelled" if seq.cancelled else "length")
                continue
            token = st.pending[0]
            tok = int(token.item() if hasattr(token, "item") else token)
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
            top = tuple((text(i), float(logprobs[i].item()), tuple(text(i).encode())) for i in ids)
        s = text(tok)
        return TokenLogprob(s, float(logprobs[tok].item()), tuple(s.encode()), top)

    def end(self, seq: Sequence) -> None:
        st = seq.engine_state
        if isinstance(st, _MlxState):
            st.gen.close()
            seq.engine_state = None

    def shutdown(self) -> None:
        self.model = None
        self.tokenizer = None


class _MlxState:
    __slots__ = ("gen", "detok", "pending", "done", "produced", "limit")

    def __init__(self, gen: Any, detok: Any, limit: int) -> None:
        self.gen = gen
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
        tok = engine.tokenizer
        self._template = model.chat_template or getattr(tok, "chat_template", None)
        self._special: dict[str, Any] = {
            "bos": getattr(tok, "bos_token", None) or "",
            "eos": getattr(tok, "eos_token", None) or "",
            "bos_id": getattr(tok, "bos_token_id", None),
            "eos_id": getattr(tok, "eos_token_id", None),
            "n_vocab": len(tok._tokenizer),
        }
        self.worker = Worker(engine, name=model.id, queue_size=queue_size)
        self._good_constraints: set[tuple[str, str]] = set()

    @property
    def chat_template(self) -> str | None:
        return self._template

    @property
    def special_tokens(self) -> dict[str, Any]:
        return self._special

    @property
    def capabilities(self) -> frozenset[str]:
        return frozenset({"completion", "chat"})

    @property
    def pending(self) -> int:
        return self.worker.pending

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        return self.engine.tokenize(text, add_special=add_special, parse_special=parse_special)

    def detokenize(self, tokens: list[int]) -> str:
        return str(self.engine.tokenizer._tokenizer.decode(tokens))

    def token_piece(self, token: int) -> str:
        return str(self.engine.tokenizer._tokenizer.convert_ids_to_tokens(token))

    def submit(self, request: GenerationRequest) -> DeltaStream:
        if request.constraint is not None and request.constraint not in self._good_constraints:
            self.engine.guide.matcher(request.constraint)  # a 400 now, before any output
            if len(self._good_constraints) > 256:
                self._good_constraints.clear()
            self._good_constraints.add(request.constraint)
        return self.worker.submit(request)

    async def embed(self, inputs: list[list[int]]) -> list[list[float]]:
        raise InvalidModel("mlx-lm has no embedding models; use a GGUF embedding model")

    def close(self) -> None:
        self.worker.close()


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

    def load(self, model: LocalModel, options: LoadOptions) -> MlxModel:
        engine = MlxEngine(model, options)
        log.info("mlx: %s loaded (ctx %d)", model.id, engine.n_ctx)
        return MlxModel(model, engine, queue_size=self.queue_size)


def _read_json(p: Path) -> dict[str, Any]:
    try:
        data = json.loads(p.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
