"""Hearth: the one façade that the GUI, the server and the CLI call."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from app.core.engine.autofit import DEFAULT_MAX_AUTO_CONTEXT
from app.core.engine.presets import PresetStore
from app.core.engine.scheduler import LoadedInfo, LoadResult, ModelScheduler
from app.core.events import EventHub, LibraryChanged, ModelLoaded, ProvidersChanged
from app.core.gateway import (
    AliasStore,
    Gateway,
    RequestFacts,
    Routing,
    access,
    ratelimit,
    request_timing,
)
from app.core.gateway.cache.replay import ResponseCache
from app.core.gateway.facts import chat_facts, completion_facts, embed_facts
from app.core.gateway.providers import manage
from app.core.gateway.providers import serve as remote
from app.core.gateway.providers.pool import ProviderPool, ProviderStatus, RemoteListing
from app.core.gateway.providers.store import ProviderConfig
from app.core.hub.downloads import DownloadManager
from app.core.inference import embed_input, images
from app.core.inference import prompt as prompting
from app.core.inference import rerank as ranking
from app.core.inference.generation import Choices, Generation
from app.core.inference.tools import ToolSetup
from app.core.library import fit
from app.core.library.index import ModelLibrary
from app.core.library.stores import ForeignLocations
from app.core.requests import (
    MAX_EMBED_INPUTS,
    ChatRequest,
    CompletionRequest,
    EmbeddingRequest,
    Embeddings,
    Reranking,
    RerankRequest,
)
from app.core.types import (
    UNSET,
    GenerationRequest,
    LoadedModel,
    LoadOptions,
    LocalModel,
    ModelStatus,
    Runtime,
    SamplingParams,
)
from app.core.util.fsutil import atomic_write_json
from app.errors import InvalidRequest, ModelNotFound, NotSupported

log = logging.getLogger(__name__)


class Hearth:
    """The application core. Lives on the service loop; every coroutine runs there."""

    def __init__(
        self,
        library: ModelLibrary,
        runtimes: Mapping[str, Runtime],
        *,
        load_defaults: Callable[[], LoadOptions],
        jit_enabled: Callable[[], bool] = lambda: True,
        events: EventHub | None = None,
        presets: PresetStore | None = None,
        budget_bytes: Callable[[], int] | None = None,
        default_ttl: Callable[[], float | None] = lambda: None,
        auto_context_cap: Callable[[], int] = lambda: DEFAULT_MAX_AUTO_CONTEXT,
        calibration_file: Path | None = None,
        downloads: DownloadManager | None = None,
        foreign: ForeignLocations | None = None,
        aliases: AliasStore | None = None,
        routing: Callable[[], Routing] = Routing,
        providers: ProviderPool | None = None,
    ) -> None:
        self.events = events or EventHub()
        # issue #3: Hub downloads and models from other apps (None where not wired)
        self.downloads = downloads  # publishes on the same EventHub (build_service wires both)
        self.foreign = foreign
        self.library = library
        self.runtimes = dict(runtimes)
        self.presets = presets
        self.scheduler = ModelScheduler(
            library,
            runtimes,
            self.events,
            load_defaults,
            presets=presets,
            budget_bytes=budget_bytes,
            default_ttl=default_ttl,
            auto_context_cap=auto_context_cap,
        )
        self._jit_enabled = jit_enabled
        # issue #11: what a request's model names (aliases, auto, default_model), and fallback
        self.providers = providers  # remote engines: PREFIX/id targets
        if providers is not None:
            providers.set_on_change(lambda: self.events.publish(ProvidersChanged()))
        self.gateway = Gateway(aliases, routing, self._is_target, self._is_loaded)
        self.response_cache = ResponseCache()  # off; the composition root wires the store
        self._calibration_file = calibration_file
        if calibration_file is not None:
            self.scheduler.set_calibration(fit.read_calibration(calibration_file))
            self.events.subscribe(self._on_event)

    def _on_event(self, event: object) -> None:
        if isinstance(event, ModelLoaded) and self._calibration_file is not None:
            values = self.scheduler.calibration()
            if values:
                try:
                    atomic_write_json(self._calibration_file, values)
                except OSError:
                    log.exception("could not save memory calibration")

    # -- routing (issue #11) -----------------------------------------------------------------
    def _is_local(self, model_id: str) -> bool:
        try:
            self.library.get(model_id)
        except ModelNotFound:
            return False
        return True

    def _is_target(self, model_id: str) -> bool:
        """A model id a request may name besides aliases: local, or a provider's PREFIX/id."""
        return self._is_local(model_id) or self._remote(model_id)

    def _remote(self, model_id: str) -> bool:
        """A provider's ``PREFIX/id`` (a library id first: the gateway's order too)."""
        return (
            self.providers is not None
            and self.providers.is_target(model_id)
            and not self._is_local(model_id)
        )

    def remote_listing(self, model_id: str) -> RemoteListing | None:
        """The provider's listing of ``model_id`` (None for an id that is not remote).

        Raises:
            ProviderUnavailable (503) / ProviderError (401): its provider is not ready;
            ModelNotFound: the provider lists no such model.
        """
        if self.providers is None or not self._remote(model_id) or not access.allowed(model_id):
            return None
        return self.providers.listing(model_id)

    def remote_models(self) -> list[RemoteListing]:
        """The models of every ready provider (``PREFIX + remote id``)."""
        return access.visible(self.providers.listings(), lambda r: r.id) if self.providers else []

    # -- providers and aliases, as the GUI edits them (the CLI edits the files directly) -----------
    def provider_statuses(self) -> list[ProviderStatus]:
        return self.providers.statuses() if self.providers is not None else []

    def add_provider(self, cfg: ProviderConfig, api_key: str | None) -> ProviderConfig:
        """Add or replace a provider (its prefix may not shadow a library id or an alias)."""
        pool = self._pool()
        ids = [m.id for m in self.library.list()]
        return pool.store.add(cfg, api_key, lambda p: manage.prefix_clash(p, ids, self.aliases()))

    def remove_provider(self, name: str) -> bool:
        return self._pool().store.remove(name)

    async def test_provider(self, name: str) -> manage.ProviderTest:
        pool = self._pool()
        e = pool.entry(name)
        return await manage.test(e.cfg, e.client)

    def set_alias(self, name: str, targets: Sequence[str]) -> tuple[str, ...]:
        if self.gateway.aliases is None:
            raise InvalidRequest("aliases are not available here")
        return self.gateway.aliases.set(name, targets, self._is_target)

    def remove_alias(self, name: str) -> bool:
        return self.gateway.aliases is not None and self.gateway.aliases.remove(name)

    def _pool(self) -> ProviderPool:
        if self.providers is None:
            raise InvalidRequest("remote providers are not available here")
        return self.providers

    def _is_loaded(self, model_id: str) -> bool:
        return self.scheduler.state(model_id) == "loaded"

    def aliases(self) -> dict[str, tuple[str, ...]]:
        """Every alias and its targets (a fallback chain when more than one), in file order."""
        return self.gateway.visible_aliases()  # those a key's --models scope reaches

    def alias(self, name: str) -> tuple[str, ...] | None:
        """One alias's targets, or None; an alias another process just wrote is found."""
        return self.gateway.visible_aliases(name).get(name)

    def is_routable(self, name: str) -> bool:
        """True for a name the gateway answers besides a local model id (an alias, ``auto``,
        a provider's ``PREFIX/id``)."""
        return self.gateway.is_routable(name) or self._remote(name)

    # -- library -------------------------------------------------------------------------
    def models(self) -> list[ModelStatus]:
        return [self._status(m) for m in access.visible(self.library.list(), lambda m: m.id)]

    def model_status(self, model_id: str) -> ModelStatus:
        return self._status(self.model(model_id))

    def _status(self, m: LocalModel) -> ModelStatus:
        info = next((i for i in self.scheduler.loaded() if i.model_id == m.id), None)
        return ModelStatus(
            m,
            self.scheduler.state(m.id),
            info.context_length if info else None,
            info.runtime if info else None,
            info.memory_bytes if info else None,
        )

    def import_model(self, path: str | Path, *, copy: bool = False) -> tuple[LocalModel, bool]:
        model, created = self.library.import_path(path, copy=copy)
        if created:
            self.events.publish(LibraryChanged())
        return model, created

    async def resolve_model(self, id_or_path: str) -> LocalModel:
        """A library id, or a path to a model file/folder (imported on the fly)."""
        p = Path(id_or_path).expanduser()
        if ("/" in id_or_path or id_or_path.endswith(".gguf")) and p.exists():
            return (await asyncio.to_thread(self.import_model, p))[0]
        return self.library.get(id_or_path)

    async def remove_model(
        self, model_id: str, *, delete_file: bool = False
    ) -> tuple[LocalModel, bool]:
        """Unload and forget a model; ``delete_file`` confirms deleting another app's file."""
        await self.scheduler.unload(model_id)
        result = self.library.remove(model_id, delete_file=delete_file)
        self.events.publish(LibraryChanged())
        return result

    async def scan_foreign_stores(self) -> list[LocalModel]:
        """Index the models the HF cache, LM Studio and Ollama hold (in place). Returns new ones."""
        if self.foreign is None:
            return []
        added = await asyncio.to_thread(self.library.index_foreign, self.foreign)
        self.events.publish(LibraryChanged())
        return added

    # -- load / unload ---------------------------------------------------------------------
    async def load(
        self,
        model_id: str,
        options: dict[str, Any] | LoadOptions | None = None,
        *,
        force: bool = False,
        ttl: Any = UNSET,
        pin: bool | None = None,
        wait: bool = False,
    ) -> LoadedModel:
        """Load (or reload) a model now (see :meth:`load_result`)."""
        result = await self.load_result(model_id, options, force=force, ttl=ttl, pin=pin, wait=wait)
        return result.model

    async def load_result(
        self,
        model_id: str,
        options: dict[str, Any] | LoadOptions | None = None,
        *,
        force: bool = False,
        ttl: Any = UNSET,
        pin: bool | None = None,
        wait: bool = False,
    ) -> LoadResult:
        """Like :meth:`load`, saying whether it loaded, reloaded or left the model unchanged."""
        self.model(model_id)
        return await self.scheduler.load_result(
            model_id, options, force=force, ttl=ttl, pin=pin, wait=wait
        )

    def loaded(self) -> list[LoadedInfo]:
        """The models in memory, with their options, TTL and pending requests."""
        return access.visible(self.scheduler.loaded(), lambda i: i.model_id)

    def loading(self) -> list[str]:
        return [m for m in self.scheduler.loading() if access.allowed(m)]

    def memory(self) -> dict[str, int]:
        """The memory budget for models and what the loaded ones use."""
        return {"budget": self.scheduler.budget(), "used": self.scheduler.used()}

    def set_pinned(self, model_id: str, pinned: bool) -> None:
        self.model(model_id)
        self.scheduler.set_pinned(model_id, pinned)

    def model(self, model_id: str) -> LocalModel:
        """The library's model as the caller may see it (routing names pass Gateway.targets):
        ModelNotFound for an unknown id, and the same for one outside the key's scope."""
        access.check(model_id)
        return self.library.get(model_id)

    def preset(self, model_id: str) -> dict[str, Any]:
        self.model(model_id)
        return self.presets.get(model_id) if self.presets is not None else {}

    def save_preset(self, model_id: str, raw: dict[str, Any]) -> dict[str, Any]:
        """Replace the model's preset (validated by the store); {} clears it."""
        self.model(model_id)
        if self.presets is None:
            raise InvalidRequest("presets are not available in this server")
        return self.presets.set(model_id, raw)

    def estimate(self, model_id: str, options: dict[str, Any] | None = None) -> dict[str, Any]:
        """The memory a load would take with these options, against the budget."""
        model = self.model(model_id)
        loaded = self.scheduler.loaded_model(model_id) is not None
        opts = self.scheduler.effective_options(model_id, options)
        choice = self.scheduler.fit_context(model, opts, replacing=model_id if loaded else None)
        est, figure = self.scheduler.estimate(model, choice.options)
        used = self.scheduler.used()
        budget = self.scheduler.budget()
        return {
            **est.as_dict(),
            "calibrated_total": figure,
            "budget": budget,
            "used": used,
            "fits": loaded or used + figure <= budget,
            "context_reason": choice.reason,  # auto-fit's choice, or "set explicitly"
        }

    async def unload(self, model_id: str) -> bool:
        if self._is_local(model_id):
            self.model(model_id)  # a model outside the key's scope: as unknown
        return await self.scheduler.unload(model_id)

    # -- inference ---------------------------------------------------------------------------
    def using(self, model_id: str) -> contextlib.AbstractAsyncContextManager[LoadedModel]:
        """The loaded model (JIT), held for the ``async with`` block (tokenize, detokenize...);
        an alias stands for its first local target."""
        return self._model(self.resolve_local(model_id))

    def resolve_local(self, name: str) -> str:
        """The local model id ``name`` stands for: itself, or an alias's (or ``auto``'s) first
        local target. Raises ModelNotFound, or NotSupported for a remote model."""
        targets = self.gateway.targets(name, RequestFacts())  # the key's scope first
        for t in targets:
            if self._is_local(t):
                return t
        if targets == [name]:
            raise NotSupported(
                f"'{name}' is served by a remote engine; this route works on local models",
                param="model",
            )
        raise NotSupported(
            f"'{name}' stands for remote models only; this route works on local models",
            param="model",
        )

    @contextlib.asynccontextmanager
    async def _model(self, model_id: str, ttl: Any = UNSET) -> AsyncIterator[LoadedModel]:
        """The model, JIT-loaded if allowed, held so keep-alive can't unload it mid-request."""
        self.model(model_id)  # never a load of a model outside the key's scope
        with request_timing.load_wait():  # the request record's load_ms
            lm = await self.scheduler.acquire(model_id, load=self._jit_enabled(), ttl=ttl)
        try:
            yield lm
        finally:
            self.scheduler.release(model_id)

    async def chat(self, req: ChatRequest) -> Choices:
        """Start a chat request on the first target its model resolves to that starts (the
        gateway: a model id, an alias's fallback chain, ``auto``, the default model). The
        Choices say which model answered and the ids tried (``model``, ``route``)."""
        ratelimit.charge(ratelimit.cost(req))  # what it can cost, before any work (settled after)
        # the response cache (issue 14) looks it up first, and runs it through the gateway
        return await self.response_cache.serve(req, chat_facts(req), self.gateway, self._chat)

    async def check_images(self, req: ChatRequest) -> None:
        """Before any image is fetched or decoded: the target ``req.model`` resolves to (as
        :meth:`chat` resolves it) must take images (UnsupportedParameter, ModelNotFound...)."""
        if images.first_image(req) is not None:
            takes = lambda t: self._takes_images(replace(req, model=t))  # noqa: E731
            await self.gateway.check(req.model, chat_facts(req), takes)

    async def _takes_images(self, req: ChatRequest) -> None:
        if self.providers is not None and self._remote(req.model):
            await remote.check_target_images(self.providers, req)
        else:
            images.check_vision(req, self.model)

    async def _chat(self, req: ChatRequest) -> Choices:
        """Start a chat request's ``n`` generations (side by side). Everything that can fail
        fails here, before any output: the conversation is planned (tools), rendered by the
        model's template and tokenized once, then submitted ``n`` times (choice ``i`` with seed
        ``seed + i`` when a seed is given, so seeded choices still differ).

        Raises:
            ModelNotFound, ContextLengthExceeded, TemplateError, QueueFull, RuntimeUnavailable,
            InvalidRequest (a reserved template variable, a tool choice naming no tool...).
        """
        if self.providers is not None and self._remote(req.model):
            return await remote.chat(self.providers, req)
        images.check_vision(req, self.model)  # before any load (issue 16)
        async with self._model(req.model, req.ttl) as lm:
            prepared = await self._plan_chat(lm, req)
            gens: list[Generation] = []
            try:
                for i in range(req.n):
                    gens.append(prepared.start(lm, prompting.choice_sampling(req.sampling, i)))
            except BaseException:
                for g in gens:
                    g.cancel()
                raise
            return Choices(gens)

    async def count_tokens(self, req: ChatRequest) -> int:
        """The prompt tokens :meth:`chat` would submit for ``req`` (the same tool planning,
        template and tokenizer), without generating; a prompt over the context is counted.

        Raises:
            ModelNotFound, TemplateError, InvalidRequest (as :meth:`chat`); NotSupported: the
            engine without an endpoint to count with (it renders the prompt there).
        """
        # resolved as chat resolves it: the key's scope, aliases, a fallback chain
        count, _ = await self.gateway.run(
            req.model, chat_facts(req), lambda m: self._count_tokens(replace(req, model=m))
        )
        return count

    async def _count_tokens(self, req: ChatRequest) -> int:
        if self.providers is not None and self._remote(req.model):
            return await remote.count_tokens(self.providers, req)
        images.check_vision(req, self.model)
        async with self._model(req.model, req.ttl) as lm:
            prepared = await self._plan_chat(lm, req, check_fits=False)
            return len(prepared.base.prompt_tokens)

    async def _plan_chat(
        self, lm: LoadedModel, req: ChatRequest, *, check_fits: bool = True
    ) -> prompting.PreparedChat:
        """Plan the tools and prepare the prompt: what :meth:`chat` submits."""
        preset = self.presets.get(req.model) if self.presets is not None else {}
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
        """Start a completion request on the first target that starts (see :meth:`chat`)."""
        ratelimit.charge(ratelimit.cost(req))
        return await self.response_cache.serve(
            req, completion_facts(req), self.gateway, self._complete
        )

    async def _complete(self, req: CompletionRequest) -> Choices:
        """Start a completion request: each prompt ``n`` times, one after the other. The first
        is validated and started here (so its errors come before any output); each next one
        starts when :meth:`Choices.get` asks for it."""
        if self.providers is not None and self._remote(req.model):
            return await remote.complete(self.providers, req)
        count = len(req.prompts) * req.n

        async def start(k: int) -> Generation:
            async with self._model(req.model, req.ttl) as lm:
                return await self._start_completion(
                    lm,
                    req,
                    req.prompts[k // req.n],
                    prompting.choice_sampling(req.sampling, k % req.n),
                )

        return Choices([await start(0)], count, start)

    async def _start_completion(
        self,
        lm: LoadedModel,
        req: CompletionRequest,
        prompt: str | Sequence[int],
        sampling: SamplingParams,
    ) -> Generation:
        t0 = time.perf_counter()
        prompting.require(lm, "completion", req.model)
        prompting.check_bias(lm, sampling)
        if isinstance(prompt, str):
            tokens = await prompting.tokenize(lm, prompt, "prompt", parse_special=False)
        else:
            tokens = list(prompt)
            vocab = int(lm.special_tokens.get("n_vocab", "0") or 0)
            if vocab and any(t < 0 or t >= vocab for t in tokens):
                raise InvalidRequest(f"prompt token ids must be in [0, {vocab})", param="prompt")
        prompting.check_fits(lm, len(tokens), "prompt")
        if req.constraint is not None:
            await lm.check_constraint(req.constraint)
        gr = GenerationRequest(
            prompt_tokens=tuple(tokens),
            max_tokens=req.max_tokens,
            sampling=sampling,
            stop=tuple(req.stop),
            request_id=req.request_id,
            logprobs=req.logprobs,
            constraint=req.constraint,
            prepare_ms=(time.perf_counter() - t0) * 1000,
        )
        return Generation(req.model, len(tokens), lm.submit(gr))

    async def embed(self, req: EmbeddingRequest) -> Embeddings:
        """Embed each input on the first target that starts (see :meth:`chat`)."""
        ratelimit.charge(ratelimit.cost(req))
        return await self._embed_routed(req)

    async def _embed_routed(self, req: EmbeddingRequest) -> Embeddings:
        result, route = await self.gateway.run(
            req.model, embed_facts(req), lambda m: self._embed(replace(req, model=m))
        )
        return replace(result, model=route[-1], route=tuple(route))

    async def _embed(self, req: EmbeddingRequest) -> Embeddings:
        """Embed each input (text or token ids).

        Raises:
            InvalidRequest: not an embedding model, an empty input, too many inputs, an input
                over the context, or ``dimensions`` the model's vectors do not have.
        """
        if self.providers is not None and self._remote(req.model):
            return await remote.embed(self.providers, req)
        inputs = req.inputs
        if len(inputs) > MAX_EMBED_INPUTS:  # every protocol's batch: one bound, here
            raise InvalidRequest(f"at most {MAX_EMBED_INPUTS} inputs per request", param="input")
        async with self._model(req.model, req.ttl) as lm:
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
        return Embeddings(vectors, sum(len(t) for t in token_lists))

    async def rerank(self, req: RerankRequest) -> Reranking:
        """Score each document against the query, best first (``top_n`` of them): by rank
        pooling on a cross-encoder, by the cosine of the embed path's vectors on an embedder.

        Raises:
            InvalidRequest: no documents or more than 200, an empty query or document, a model
                that does not rerank; ContextLengthExceeded: a query and document over the
                context; NotSupported: a remote engine with neither rerank nor embeddings.
        """
        ranking.check(req)
        ratelimit.charge(ratelimit.cost(req))
        result, _ = await self.gateway.run(
            req.model, RequestFacts(), lambda m: self._rerank(replace(req, model=m))
        )
        return result

    async def _rerank(self, req: RerankRequest) -> Reranking:
        if self.providers is not None and self._remote(req.model):
            return await remote.rerank(self.providers, req)
        async with self._model(req.model, req.ttl) as lm:
            ranking.check_model(lm, req.model)
            if "embeddings" in lm.capabilities:
                emb = await self._embed_routed(  # charged as this rerank already
                    EmbeddingRequest(req.model, (req.query, *req.documents), req.ttl)
                )
                return ranking.by_cosine(
                    emb.vectors[0], emb.vectors[1:], req.top_n, emb.prompt_tokens
                )

            async def tokenize(text: str, param: str) -> list[int]:
                return await prompting.tokenize(
                    lm, text, param, parse_special=False, add_special=False
                )

            return await ranking.cross_encode(lm, req, tokenize)

    async def close(self) -> None:
        if self.providers is not None:
            await self.providers.close()
        if self.downloads is not None:
            await self.downloads.close()  # partial downloads stay on disk, resumable
        await self.scheduler.close()
        self.response_cache.close()
