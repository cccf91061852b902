"""Requests run on the models of this machine: the model held (loaded on demand) while a
request is prepared and submitted, the conversation planned (tools) and rendered, then
generated, embedded or scored.

The request names one local model here: the gateway has resolved aliases, fallback chains and
the caller's scope, and the dispatcher sent remote targets to their providers.
Tested by tests/core/engine/test_scheduler.py and tests/core/inference/test_prompt.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Sequence

from app.core.engine.models import ModelService
from app.core.engine.presets import PresetStore
from app.core.engine.scheduler import ModelScheduler
from app.core.inference import embed_input, fim, scoring
from app.core.inference import prompt as prompting
from app.core.inference import rerank as ranking
from app.core.inference.generation import Choices, Generation
from app.core.inference.tools import ToolSetup
from app.core.requests import (
    MAX_EMBED_INPUTS,
    ChatRequest,
    CompletionRequest,
    EmbeddingRequest,
    Embeddings,
    Infill,
    RequestContext,
    Reranking,
    RerankRequest,
    Transcription,
    TranscriptionRequest,
)
from app.core.types import (
    UNSET,
    Delta,
    GenerationRequest,
    GenerationStream,
    LoadedModel,
    SamplingParams,
    Timings,
    Transcriber,
    Usage,
)
from app.errors import InvalidRequest


class LocalRunner:
    """Runs requests on local models: held from the scheduler for as long as each needs."""

    def __init__(
        self,
        models: ModelService,
        scheduler: ModelScheduler,
        presets: PresetStore | None = None,
        jit_enabled: Callable[[], bool] = lambda: True,
    ) -> None:
        self._models = models
        self._scheduler = scheduler
        self._presets = presets
        self._jit_enabled = jit_enabled

    @contextlib.asynccontextmanager
    async def using(
        self, model_id: str, ctx: RequestContext, ttl: object = UNSET
    ) -> AsyncIterator[LoadedModel]:
        """The model, JIT-loaded if allowed, held so keep-alive can't unload it mid-request;
        the wait for it is the request's ``load_ms``."""
        self._models.get(model_id, ctx.models)  # never a load of a model outside the scope
        started = time.perf_counter()
        if ctx.load_started_ns is None:
            ctx.load_started_ns = time.time_ns()
        try:
            lm = await self._scheduler.acquire(model_id, load=self._jit_enabled(), ttl=ttl)
        finally:
            ctx.load_ms = (ctx.load_ms or 0.0) + (time.perf_counter() - started) * 1000
        try:
            yield lm
        finally:
            self._scheduler.release(model_id)

    async def chat(self, req: ChatRequest) -> Choices:
        """Start a chat request's ``n`` generations (side by side). Everything that can fail
        fails here, before any output: the conversation is planned (tools), rendered by the
        model's template and tokenized once, then submitted ``n`` times (choice ``i`` with seed
        ``seed + i`` when a seed is given, so seeded choices still differ).

        Raises:
            ModelNotFound, ContextLengthExceeded, TemplateError, QueueFull, RuntimeUnavailable,
            InvalidRequest (a reserved template variable, a tool choice naming no tool...).
        """
        async with self.using(req.model, req.context, req.ttl) as lm:
            prepared = await self._plan_chat(lm, req)
            lead: Delta | None = None
            if req.prompt_logprobs is not None:
                [scored] = await scoring.score(
                    lm,
                    req.model,
                    [prepared.base.prompt_tokens],
                    req.prompt_logprobs,
                    "prompt_logprobs",
                )
                lead = scoring.lead_delta(scored)
            gens: list[Generation] = []
            try:
                for i in range(req.n):
                    gen = prepared.start(lm, prompting.choice_sampling(req.sampling, i))
                    if lead is not None:
                        gen.lead(lead)
                    gens.append(gen)
            except BaseException:
                for g in gens:
                    g.cancel()
                raise
            return Choices(gens)

    async def count_tokens(self, req: ChatRequest) -> int:
        """The prompt tokens :meth:`chat` would submit (a prompt over the context counts)."""
        return len(await self.prompt_tokens(req))

    async def prompt_tokens(self, req: ChatRequest) -> list[int]:
        """The prompt :meth:`chat` would submit, as token ids (one over the context too)."""
        async with self.using(req.model, req.context, req.ttl) as lm:
            prepared = await self._plan_chat(lm, req, check_fits=False)
            return list(prepared.base.prompt_tokens)

    async def _plan_chat(
        self, lm: LoadedModel, req: ChatRequest, *, check_fits: bool = True
    ) -> prompting.PreparedChat:
        """Plan the tools and prepare the prompt: what :meth:`chat` submits."""
        preset = self._presets.get(req.model) if self._presets is not None else {}
        call = ToolSetup.plan(
            lm,
            preset,
            req.messages,
            req.tools,
            req.tool_choice.choice,
            req.tool_choice.parallel,
        )
        constraint = call.constraint if call.constraint is not None else req.constraint
        return await prompting.prepare_chat(lm, req, call, constraint, must_fit=check_fits)

    async def complete(self, req: CompletionRequest) -> Choices:
        """Start a completion request: each prompt ``n`` times, one after the other. The first
        is validated and started here (so its errors come before any output); each next one
        starts when :meth:`Choices.get` asks for it."""
        count = len(req.prompts) * req.n
        if req.infill is not None and (req.echo or req.prompt_logprobs is not None):
            raise InvalidRequest(
                "echo and prompt_logprobs are not available with fill-in-the-middle",
                param="echo" if req.echo else "prompt_logprobs",
            )
        if req.echo or req.prompt_logprobs is not None:
            return await self._complete_scored(req)

        async def start(k: int) -> Generation:
            async with self.using(req.model, req.context, req.ttl) as lm:
                return await self._start_completion(
                    lm,
                    req,
                    req.prompts[k // req.n],
                    prompting.choice_sampling(req.sampling, k % req.n),
                )

        return Choices([await start(0)], count, start)

    async def _complete_scored(self, req: CompletionRequest) -> Choices:
        """Echo or prompt_logprobs: every prompt scored first, in one job (a prefix they share
        is read once), then each choice generated after its prompt's delta (or not at all:
        ``max_tokens`` 0 scores the prompts only)."""
        param = "echo" if req.echo else "prompt_logprobs"
        echo_top = (req.logprobs or 0) if req.echo else 0  # echo's logprobs cover the prompt
        top = max(echo_top, req.prompt_logprobs or 0)
        async with self.using(req.model, req.context, req.ttl) as lm:
            prompting.require(lm, "completion", req.model)
            token_lists = [await self._prompt_tokens(lm, p) for p in req.prompts]
            scored = await scoring.score(lm, req.model, token_lists, top, param)

        async def start(k: int) -> Generation:
            i = k // req.n
            text = scoring.echo_text(req.prompts[i], scored[i]) if req.echo else ""
            lead = scoring.lead_delta(scored[i], text)
            if req.max_tokens == 0:
                final = scoring.prompt_only(scored[i])
                stream = scoring.LedStream(lead, None, final)
                return Generation(req.model, len(token_lists[i]), stream)
            async with self.using(req.model, req.context, req.ttl) as lm:
                gen = await self._start_completion(
                    lm, req, token_lists[i], prompting.choice_sampling(req.sampling, k % req.n)
                )
            gen.lead(lead)
            return gen

        return Choices([await start(0)], len(req.prompts) * req.n, start)

    async def _prompt_tokens(self, lm: LoadedModel, prompt: str | Sequence[int]) -> list[int]:
        """A completion prompt's tokens (text tokenized, ids checked against the vocabulary),
        checked to fit the context. The text's special tokens are parsed, as llama-server,
        vLLM, Ollama's raw mode and mlx-lm do: a raw prompt is written for the model, markers
        included (Twinny's fill-in-the-middle templates, a chat format laid out by hand)."""
        if isinstance(prompt, str):
            tokens = await prompting.tokenize(lm, prompt, "prompt", parse_special=True)
        else:
            tokens = list(prompt)
            vocab = int(lm.special_tokens.get("n_vocab", "0") or 0)
            if vocab and any(t < 0 or t >= vocab for t in tokens):
                raise InvalidRequest(f"prompt token ids must be in [0, {vocab})", param="prompt")
        prompting.check_fits(lm, len(tokens), "prompt")
        return tokens

    async def _start_completion(
        self,
        lm: LoadedModel,
        req: CompletionRequest,
        prompt: str | Sequence[int],
        sampling: SamplingParams,
    ) -> Generation:
        t0 = time.perf_counter()
        # first for fill-in-the-middle: its refusal names the suffix (an embedding model's too)
        infill = req.infill
        tokens = await self._infill_tokens(lm, req, infill, prompt) if infill else None
        prompting.require(lm, "completion", req.model)
        prompting.check_bias(lm, sampling)
        if tokens is None:
            tokens = await self._prompt_tokens(lm, prompt)
        if req.constraint is not None:
            await lm.check_constraint(req.constraint)
        if infill is not None and req.max_tokens == 0:  # an editor's check: no answer asked
            final = Delta(finish_reason="length", usage=Usage(len(tokens), 0), timings=Timings())
            return Generation(req.model, len(tokens), scoring.LedStream(Delta(), None, final))
        gr = GenerationRequest(
            prompt_tokens=tuple(tokens),
            max_tokens=req.max_tokens,
            sampling=sampling,
            stop=tuple(req.stop),
            request_id=req.request_id,
            logprobs=req.logprobs,
            constraint=req.constraint,
            prepare_ms=(time.perf_counter() - t0) * 1000,
            max_prompt_ms=req.max_prompt_ms,
            max_predict_ms=req.max_predict_ms,
            # an editor's completion is read before others' prompts, however long its answer
            priority=req.priority if infill is None else min(req.priority, fim.INFILL_PRIORITY),
        )
        stream: GenerationStream = lm.submit(gr)
        indent = infill.indent if infill is not None else 0
        if req.max_predict_ms or indent:
            stream = fim.InfillStops(stream, max_predict_ms=req.max_predict_ms, indent=indent)
        return Generation(req.model, len(tokens), stream)

    async def _infill_tokens(
        self, lm: LoadedModel, req: CompletionRequest, infill: Infill, prompt: str | Sequence[int]
    ) -> list[int]:
        """A fill-in-the-middle prompt: the model's FIM tokens around the text before and
        after the cursor (app/core/inference/fim), checked to fit the context."""
        tokens = fim.require_fim(lm, req.model, infill.param)
        if not isinstance(prompt, str):
            raise InvalidRequest("fill-in-the-middle takes the prefix as text", param="prompt")
        for text, param in (
            (prompt, "prompt"),
            (infill.suffix, infill.param),
            (infill.cursor, "prompt"),
            *((name + text, "input_extra") for name, text in infill.extra),
        ):
            prompting.check_size(lm, text, param)
        special = lm.special_tokens
        bos = special.get("bos_id") if special.get("add_bos") else None
        window = fim.window_for(lm.context_length)
        reserve = req.max_tokens if req.max_tokens is not None else window // 4

        def tokenize(text: str) -> list[int]:
            return lm.tokenize(text, add_special=False, parse_special=False)

        ids = await asyncio.to_thread(
            fim.build_infill,
            tokens,
            tokenize,
            prefix=prompt,
            suffix=infill.suffix,
            extra=infill.extra,
            cursor=infill.cursor,
            n_ctx=lm.context_length,
            n_predict=reserve,
            bos=bos if isinstance(bos, int) else None,
        )
        prompting.check_fits(lm, len(ids), "prompt")
        return ids

    async def embed(self, req: EmbeddingRequest) -> Embeddings:
        """Embed each input (text or token ids).

        Raises:
            InvalidRequest: not an embedding model, an empty input, too many inputs, an input
                over the context, or ``dimensions`` the model's vectors do not have.
        """
        inputs = req.inputs
        if len(inputs) > MAX_EMBED_INPUTS:  # every protocol's batch: one bound, here
            raise InvalidRequest(f"at most {MAX_EMBED_INPUTS} inputs per request", param="input")
        async with self.using(req.model, req.context, req.ttl) as lm:
            if "embeddings" not in lm.capabilities:
                raise InvalidRequest(
                    f"'{req.model}' is a chat/completion model, not an embedding model; load an "
                    f"embedding model (e.g. a BERT or nomic-embed GGUF) for /v1/embeddings",
                    param="model",
                )
            token_lists = await embed_input.token_lists(lm, inputs)
            vectors = await lm.embed(token_lists)
        if req.dimensions is not None and vectors and req.dimensions != len(vectors[0]):
            # truncating a non-Matryoshka embedding silently degrades it: say so instead
            raise InvalidRequest(
                f"this model's embeddings have {len(vectors[0])} dimensions and cannot be shortened",
                param="dimensions",
            )
        return Embeddings(vectors, sum(len(t) for t in token_lists), req.model, (req.model,))

    async def rerank(self, req: RerankRequest) -> Reranking:
        """Score the documents: rank pooling on a cross-encoder, the cosine of the embed path's
        vectors on an embedder."""
        async with self.using(req.model, req.context, req.ttl) as lm:
            ranking.check_model(lm, req.model)
            if "embeddings" in lm.capabilities:
                emb = await self.embed(
                    EmbeddingRequest(
                        req.model, (req.query, *req.documents), req.ttl, context=req.context
                    )
                )
                return ranking.by_cosine(
                    emb.vectors[0], emb.vectors[1:], req.top_n, emb.prompt_tokens
                )

            async def tokenize(text: str, param: str) -> list[int]:
                return await prompting.tokenize(
                    lm, text, param, parse_special=False, add_special=False
                )

            return await ranking.cross_encode(lm, req, tokenize)

    async def transcribe(self, req: TranscriptionRequest) -> Transcription:
        """Decode the audio and start the speech model on it. A model that does not transcribe
        is refused from the library's entry, before anything is loaded.

        Raises:
            InvalidRequest: not a speech model (param ``model``); the audio unreadable or over
                its bounds (param ``file``); SpeechUnavailable (503) without the speech extra.
        """
        model = self._models.get(req.model, req.context.models)
        if "transcription" not in model.capabilities:
            kind = "an embedding" if "embeddings" in model.capabilities else "a chat"
            raise InvalidRequest(
                f"'{req.model}' is {kind} model, not a speech-to-text model; name a Whisper "
                "model (a CTranslate2 folder) for /v1/audio/transcriptions and translations",
                param="model",
            )
        async with self.using(req.model, req.context, req.ttl) as lm:
            if not isinstance(lm, Transcriber):
                raise InvalidRequest(f"'{req.model}' cannot transcribe here", param="model")
            transcript = await lm.transcribe(req.job)
        return Transcription(transcript, req.model, (req.model,))
