"""In-process llama.cpp through llama-cpp-python's low-level API.

One worker thread owns each loaded model (model, context, batch, samplers). We drive llama.cpp
ourselves (tokenize, decode, sample, detokenize) instead of the high-level ``Llama`` class so that
a long prompt can be aborted (abort callback), per-token overhead stays small, no logits are kept,
and several sequences can later share one batch.
"""

from __future__ import annotations

import collections
import logging
import threading
from pathlib import Path
from typing import Any

from app.core.inference.images import ImageInput
from app.core.types import Constraint, GenerationRequest, LoadOptions, LocalModel, ScoredPrompt
from app.errors import InvalidRequest, ModelUnloaded, RuntimeUnavailable, UnsupportedParameter
from app.runtimes.grammar.compile_pool import COMPILE_POOL
from app.runtimes.llama.backend import L, build_info, ensure_backend
from app.runtimes.llama.engine import LlamaEngine
from app.runtimes.llama.grammar import grammar_for
from app.runtimes.llama.vision import check_projector, projector_path
from app.runtimes.worker import Again, DeltaStream, Worker

log = logging.getLogger(__name__)

MAX_GRAMMARS = 256  # compiled grammars a model remembers (at most 256 KiB each)


class LlamaCppModel:
    """A loaded GGUF model: the LoadedModel protocol over a worker thread and its engine."""

    def __init__(self, model: LocalModel, engine: LlamaEngine, *, queue_size: int) -> None:
        self.model_id = model.id
        self.engine = engine
        self.context_length = engine.n_ctx  # the most one request may use
        self.cache_tokens = engine.cache_tokens  # the KV cache's cells, all sequences together
        self.parallel = engine.max_sequences
        self._template = model.chat_template or engine.meta("tokenizer.chat_template")
        self._special = _special_tokens(engine)
        self.worker = Worker(engine, name=model.id, queue_size=queue_size)
        # constraint -> its grammar, checked and compiled; the most recently used last
        self._grammars: collections.OrderedDict[Constraint, str] = collections.OrderedDict()

    @property
    def chat_template(self) -> str | None:
        return self._template

    @property
    def special_tokens(self) -> dict[str, Any]:
        return self._special

    @property
    def pending(self) -> int:
        return self.worker.pending

    @property
    def queue_full(self) -> bool:
        return self.worker.queue_full

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        return self.engine.tokenize(text, add_special=add_special, parse_special=parse_special)

    def detokenize(self, tokens: list[int]) -> str:
        return b"".join(self.engine.pieces(tokens)).decode("utf-8", errors="replace")

    def token_pieces(self, tokens: list[int]) -> list[str]:
        return [
            p.decode("utf-8", errors="replace") for p in self.engine.pieces(tokens, special=True)
        ]

    @property
    def max_token_bytes(self) -> int:
        return self.engine.max_token_bytes

    @property
    def capabilities(self) -> frozenset[str]:
        if self.engine.is_reranker:  # its pooled output is a score, not a vector
            return frozenset({"rerank"})
        if self.engine.is_embedding:
            return frozenset({"embeddings", "rerank"})
        if self.engine.vision is not None:
            return frozenset({"completion", "chat", "vision"})
        return frozenset({"completion", "chat"})

    async def tokenize_images(self, text: str, images: tuple[ImageInput, ...]) -> list[int]:
        """The rendered prompt's tokens with each image's positions (its pseudo-tokens), by
        libmtmd on the worker thread, which owns the projector."""
        vision = self.engine.vision
        if vision is None:
            raise UnsupportedParameter(
                f"'{self.model_id}' does not take images", param=images[0].where or "messages"
            )
        return await self.worker.run(lambda _cancelled: vision.projector.tokenize(text, images))

    def submit(self, request: GenerationRequest) -> DeltaStream:
        grammar = None
        if request.constraint is not None:
            # check_constraint stored it, and nothing awaited since (the engine never converts)
            grammar = self._grammars.get(request.constraint)
            if grammar is None:
                raise InvalidRequest(
                    "the output constraint was not compiled before the request was queued",
                    param=_param(request.constraint),
                )
        return self.worker.submit(request, grammar)

    async def check_constraint(self, constraint: Constraint) -> None:
        """Convert the constraint into a grammar, check and compile it on a compile thread
        (app/runtimes/grammar/compile_pool.py): never on this model's worker, whose streams would stall
        meanwhile, nor on the event loop. A bad one is a 400 before any output."""
        if constraint in self._grammars:
            self._grammars.move_to_end(constraint)
            return
        grammar = await COMPILE_POOL.run(lambda _stop: self._compile(constraint))
        self._grammars[constraint] = grammar
        while len(self._grammars) > MAX_GRAMMARS:
            self._grammars.popitem(last=False)

    def _compile(self, constraint: Constraint) -> str:
        grammar = grammar_for(constraint)
        if grammar is None or not self.engine.grammar_compiles(grammar):
            raise InvalidRequest(
                "the schema does not compile to a grammar", param=_param(constraint)
            )
        return grammar

    async def embed(self, inputs: list[list[int]]) -> list[list[float]]:
        def job(cancelled: threading.Event) -> list[list[float]]:
            out = []
            for t in inputs:  # an unload or a gone client stops a long batch between inputs
                if cancelled.is_set():
                    raise ModelUnloaded("the embedding request was stopped (model unloaded)")
                out.append(self.engine.embed(t))
            return out

        return await self.worker.run(job)

    async def score_prompts(self, prompts: list[list[int]], top: int) -> list[ScoredPrompt]:
        """Every prompt token's log-probability: the list in waves of prompts read together
        (a prefix they share is read once), a wave a job step, so running generations step
        between waves."""
        out: list[ScoredPrompt] = []

        def job(cancelled: threading.Event) -> list[ScoredPrompt] | Again:
            if cancelled.is_set():  # an unload or a gone client stops a long list between waves
                raise ModelUnloaded("the scoring request was stopped (model unloaded)")
            out.extend(self.engine.score_wave(prompts[len(out) :], top))
            return Again(job) if len(out) < len(prompts) else out

        return await self.worker.run(job)

    async def rank(self, query: list[int], documents: list[list[int]]) -> tuple[list[float], int]:
        def job(cancelled: threading.Event) -> tuple[list[float], int]:
            out, tokens = [], 0
            for d in documents:
                if cancelled.is_set():
                    raise ModelUnloaded("the rerank request was stopped (model unloaded)")
                pair = self.engine.rank_pair(query, d)
                out.append(self.engine.score(pair))
                tokens += len(pair)
            return out, tokens

        return await self.worker.run(job)

    def close(self) -> None:
        self.worker.close()


def _param(constraint: Constraint) -> str:
    return "tools" if constraint[0] == "tool_call" else "response_format"


class LlamaCppRuntime:
    """Loads GGUF models in process. ``probe_file`` remembers the probe children's verdicts."""

    name = "llama.cpp"
    formats = ("gguf",)

    def __init__(self, *, probe_file: Path | None = None, queue_size: int = 16) -> None:
        from app.runtimes.llama.probe import Prober

        self.probe_file = probe_file
        self.queue_size = queue_size
        self.prober = Prober(probe_file)

    def available(self) -> bool:
        return L is not None

    @property
    def gpu_offload(self) -> bool:
        """Whether this llama.cpp build can offload layers to a GPU (the Load dialog says so)."""
        if L is None:
            return False
        try:
            ensure_backend()  # a build with loadable backends knows its GPUs once they load
        except RuntimeUnavailable:
            return False
        return bool(L.llama_supports_gpu_offload())

    def system_report(self) -> dict[str, Any]:
        """llama.cpp's build, backends and devices, and the AMX probe's verdict (the doctor)."""
        from app.runtimes.llama.system import amx_report, llama_report

        return {"llama_cpp": llama_report(), "amx_probe": amx_report(self.probe_file)}

    def load(self, model: LocalModel, options: LoadOptions) -> LlamaCppModel:
        if L is None:
            raise RuntimeUnavailable("llama-cpp-python is not installed")
        projector = projector_path(model)
        if projector:  # a mismatched projector is refused before the model loads
            check_projector(model, projector)
        # our bounds-checked header check, what llama.cpp would assert on, then a child process
        # that loads the file and serves it once: only then llama.cpp in this process
        safe = self.prober.check_model(model, options, build_info=build_info())
        engine = LlamaEngine(model, options, extra_bufts=safe)
        log.info(
            "llama.cpp: %s loaded (ctx %d, batch %d, threads %d, extra buffer types %s)",
            model.id,
            engine.n_ctx,
            engine.n_batch,
            engine.threads,
            "on" if safe else "off",
        )
        return LlamaCppModel(model, engine, queue_size=self.queue_size)

    def close(self) -> None:
        """Kill the probe children still running (their loads fail as abandoned)."""
        self.prober.close()


def _special_tokens(engine: LlamaEngine) -> dict[str, Any]:
    """The vocabulary's special tokens (text and id, FIM markers too) and how it tokenizes,
    from the GGUF's ``tokenizer.ggml.*`` keys as llama.cpp read them."""
    v = engine.vocab

    def text(tok: int) -> str:
        return engine.piece(tok, special=True).decode(errors="replace") if tok >= 0 else ""

    unk_meta = engine.meta("tokenizer.ggml.unknown_token_id")
    unk = int(unk_meta) if unk_meta and unk_meta.isdigit() else -1
    unk = unk if unk < engine.n_vocab else -1
    out: dict[str, Any] = {
        "tokenizer_model": engine.meta("tokenizer.ggml.model") or "",
        "add_bos": bool(L.llama_vocab_get_add_bos(v)),
        "add_eos": bool(L.llama_vocab_get_add_eos(v)),
        "n_vocab": engine.n_vocab,
    }
    for name, tok in (
        ("bos", L.llama_vocab_bos(v)),
        ("eos", L.llama_vocab_eos(v)),
        ("pad", L.llama_vocab_pad(v)),
        ("unk", unk),
        # fill-in-the-middle markers: the GGUF's fim_*_token_id keys, else what llama.cpp
        # recognised by text (app/core/inference/fim looks up what is still missing)
        ("fim_pre", L.llama_vocab_fim_pre(v)),
        ("fim_suf", L.llama_vocab_fim_suf(v)),
        ("fim_mid", L.llama_vocab_fim_mid(v)),
        ("fim_pad", L.llama_vocab_fim_pad(v)),
        ("fim_rep", L.llama_vocab_fim_rep(v)),
        ("fim_sep", L.llama_vocab_fim_sep(v)),
    ):
        out[name] = text(tok)
        out[f"{name}_id"] = tok if tok >= 0 else None
    return out
