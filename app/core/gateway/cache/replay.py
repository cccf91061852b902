"""The response cache: answers to repeated deterministic requests, replayed.

The key is the resolved internal request (the gateway's target list, the conversation or
prompts, every sampling field, tools, constraint, stop, logprobs, n...), never the wire bytes,
and never what does not change the output (stream, keep-alive, request ids): a hit may come
from another protocol. Only deterministic requests (temperature 0, or a seed) are served and
stored unless the client sends ``x-hearth-cache: force``. What is stored is each choice's deltas
as its :class:`Generation` yielded them (think text and tool calls split out); a hit replays
them as Generations, so the server's one streaming path and the protocol adapters write it
exactly as a fresh answer. Semantic mode also hits on a near-duplicate last user message
(cosine of the configured embedding model's vectors), among requests identical in all else.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from typing import Any, TypeVar

from app.core.engine.presets import PresetStore
from app.core.gateway import Gateway, RequestFacts
from app.core.gateway.cache.store import (
    CACHE_MODES,
    CACHE_SCOPES,
    AnswerStore,
    CacheConfig,
    CachedAnswer,
)
from app.core.inference.generation import Choices, Generation
from app.core.library.index import ModelLibrary
from app.core.requests import ChatRequest, CompletionRequest, EmbeddingRequest, Embeddings
from app.core.types import ChatMessage, Delta, SamplingParams, Timings
from app.errors import ModelNotFound

log = logging.getLogger(__name__)

__all__ = [
    "CACHE_MODES",
    "CACHE_SCOPES",
    "CacheConfig",
    "ResponseCache",
    "directive",
    "request_keys",
]

# what a client may ask with the request header ``x-hearth-cache``
DIRECTIVES = ("force", "bypass", "no-store")
STORED_FINISHES = frozenset({"stop", "length", "tool_calls"})  # generations that ended normally

Req = TypeVar("Req", ChatRequest, CompletionRequest)
Embed = Callable[[EmbeddingRequest], Awaitable[Embeddings]]


def directive(header: str | None) -> str | None:
    """The client's ``x-hearth-cache`` request header as a directive (an unknown value: none)."""
    value = (header or "").strip().lower()
    return value if value in DIRECTIVES else None


def deterministic(sampling: SamplingParams) -> bool:
    """Greedy (temperature 0) or seeded: the same request gives the same answer."""
    return sampling.temperature == 0 or sampling.seed is not None


# -- keys --------------------------------------------------------------------------------------
_FLOAT_FIELDS = tuple(f.name for f in dataclasses.fields(SamplingParams) if f.type == "float")


def _sampling(s: SamplingParams) -> dict[str, Any]:
    d = dataclasses.asdict(s)
    for name in _FLOAT_FIELDS:  # 0 and 0.0 are one temperature, whatever the protocol parsed
        d[name] = float(d[name])
    if not d["infill"]:  # only when asked: the keys of answers stored before stay valid
        del d["infill"]
    return d


def request_fields(req: ChatRequest | CompletionRequest, targets: list[Any]) -> dict[str, Any]:
    """Every field of ``req`` that changes the output, with the model as resolved."""
    out: dict[str, Any] = {
        "targets": list(targets),
        "sampling": _sampling(req.sampling),
        "max_tokens": req.max_tokens,
        "stop": list(req.stop),
        "constraint": list(req.constraint) if req.constraint is not None else None,
        "logprobs": req.logprobs,
        "n": req.n,
    }
    if isinstance(req, ChatRequest):
        out.update(
            kind="chat",
            messages=[_message_fields(m) for m in req.messages],
            tools=[dataclasses.asdict(t) for t in req.tools],
            tool_choice=dataclasses.asdict(req.tool_choice),
            template_vars=req.template_vars,
        )
    else:
        out.update(
            kind="completion", prompts=[p if isinstance(p, str) else list(p) for p in req.prompts]
        )
        if req.echo:  # only when asked: the keys of answers stored before stay valid
            out["echo"] = True
        if req.infill is not None:  # fill-in-the-middle: what follows the cursor, and its stops
            out["infill"] = dataclasses.asdict(req.infill)
            out["max_predict_ms"] = req.max_predict_ms
    if req.prompt_logprobs is not None:
        out["prompt_logprobs"] = req.prompt_logprobs
    return out


def _message_fields(m: ChatMessage) -> dict[str, Any]:
    """A message as key fields: its images by digest (never their pixels); a text message's
    fields as before images existed (kept keys stay valid)."""
    out = dataclasses.asdict(dataclasses.replace(m, images=(), image_sources=()))
    del out["images"], out["image_sources"]
    if m.images:
        out["images"] = [i.digest for i in m.images]
    return out


def _digest(fields: dict[str, Any]) -> str:
    text = json.dumps(fields, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def local_identity(library: ModelLibrary, presets: PresetStore | None) -> Callable[[str], Any]:
    """What a target stands for in a key: a library model's file (path, size, mtime) and
    preset (tool format, load options), so a replaced file or an edited preset misses; a
    remote model's id."""

    def identity(model_id: str) -> Any:
        try:
            m = library.get(model_id)
        except ModelNotFound:
            return model_id
        return [m.id, m.path, m.size_bytes, m.mtime, presets.get(m.id) if presets else {}]

    return identity


def request_keys(
    req: ChatRequest | CompletionRequest, targets: list[Any], partition: str | None = None
) -> tuple[str, str | None, str | None]:
    """``(key, semantic key, last user message)``. The semantic key is the key of the request
    with its last user message left out (None, and no text, for a request without one: raw
    completions, a conversation with no user turn). Both hold ``partition`` when given (the
    caller's key digest), so exact and semantic matches stay within one key's answers."""
    fields = request_fields(req, targets)
    if partition is not None:
        fields["partition"] = partition
    key = _digest(fields)
    if not isinstance(req, ChatRequest):
        return key, None, None
    last = next(
        (i for i in reversed(range(len(req.messages))) if req.messages[i].role == "user"), None
    )
    if last is None or not req.messages[last].content.strip():
        return key, None, None
    fields["messages"][last]["content"] = None
    return key, _digest(fields), req.messages[last].content


# -- replay and recording ----------------------------------------------------------------------
def _replayed_final(d: Delta) -> Delta:
    """A hit's final delta: the prompt's tokens all cached, and no time spent decoding."""
    u = d.usage
    if u is None:
        return d
    return replace(
        d,
        usage=replace(u, cached_tokens=u.prompt_tokens),
        timings=Timings(cache_n=u.prompt_tokens, predicted_n=u.completion_tokens),
    )


class _Replay:
    """A GenerationStream over stored deltas."""

    def __init__(self, deltas: tuple[Delta, ...]) -> None:
        self._deltas = deltas
        self._cancelled = False

    async def _run(self) -> AsyncIterator[Delta]:
        for d in self._deltas:
            if self._cancelled:
                yield Delta(finish_reason="cancelled")
                return
            yield _replayed_final(d) if d.finish_reason is not None else d

    def __aiter__(self) -> AsyncIterator[Delta]:
        return self._run()

    def cancel(self) -> None:
        self._cancelled = True


class _Recorder:
    """Gathers a fresh answer's choices; stores the answer once every one ended normally."""

    def __init__(self, put: Callable[[CachedAnswer], Awaitable[None]], count: int) -> None:
        self._put = put
        self._count = count
        self._done: dict[int, tuple[Delta, ...]] = {}
        self._failed = False
        self.model = ""

    async def ended(self, index: int, deltas: list[Delta]) -> None:
        final = deltas[-1]
        if self._failed or final.finish_reason not in STORED_FINISHES:
            self._failed = True  # one failed choice: the answer is never stored
            return
        self._done[index] = tuple(deltas)
        if len(self._done) == self._count:
            answer = CachedAnswer(self.model, tuple(self._done[i] for i in range(self._count)))
            await self._put(answer)

    def wrap(self, index: int, gen: Generation) -> Generation:
        return Generation(gen.model_id, gen.prompt_tokens, _Recording(gen, self, index))


class _Recording:
    """A GenerationStream that passes a generation's deltas on and keeps them. The answer is
    stored before its last final delta goes out, so a repeat sent once the client has the
    answer finds it."""

    def __init__(self, gen: Generation, recorder: _Recorder, index: int) -> None:
        self._gen = gen
        self._recorder = recorder
        self._index = index

    async def _run(self) -> AsyncIterator[Delta]:
        kept: list[Delta] = []
        async for d in self._gen:
            kept.append(d)
            if d.finish_reason is not None:
                await self._recorder.ended(self._index, kept)
            yield d

    def __aiter__(self) -> AsyncIterator[Delta]:
        return self._run()

    def cancel(self) -> None:
        self._gen.cancel()


# -- the cache ---------------------------------------------------------------------------------
class ResponseCache:
    """Looks requests up before the gateway runs them, and stores what they answered.

    Args:
        store: where answers are kept: the SQLite store, or one several gateways share
            (None: the cache is off whatever the settings say).
        config: the ``cache`` settings as of now (read per request; the file is cached).
        embed: the service's embed path, for semantic mode.
        clock: wall-clock seconds (a seam: tests move time for the TTL).
        identity: what the key holds for each target model (see :func:`local_identity`).
        mode: this run's mode, over the settings' (``hearth serve --cache MODE``).
    """

    def __init__(
        self,
        store: AnswerStore | None = None,
        config: Callable[[], CacheConfig] = CacheConfig,
        *,
        embed: Embed | None = None,
        clock: Callable[[], float] = time.time,
        identity: Callable[[str], Any] = str,
        mode: str | None = None,
    ) -> None:
        self.store = store
        self.identity = identity  # a target model id -> what the key holds for it
        self.config = config
        self.embed = embed
        self.clock = clock
        self.mode_override = mode  # ``hearth serve --cache MODE`` for this run (None: settings)
        self._warned: set[str] = set()

    def mode(self) -> str:
        if self.store is None:
            return "off"
        return self.mode_override or self.config().mode

    async def serve(
        self,
        req: Req,
        facts: RequestFacts,
        gateway: Gateway,
        start: Callable[[Req], Awaitable[Choices]],
    ) -> Choices:
        """Answer ``req`` from the cache, or start it on the first target that starts (the
        gateway) and keep its answer. ``Choices.cache`` says which: hit | semantic | miss |
        bypass (None when the cache is off)."""

        async def fresh() -> Choices:
            choices, route = await gateway.run(
                req.model, facts, req.context, lambda m: start(replace(req, model=m))
            )
            choices.model, choices.route = route[-1], route
            return choices

        mode = self.mode()
        if mode == "off" or self.store is None:
            return await fresh()
        store, cfg = self.store, self.config()
        asked = req.context.cache
        if asked in ("bypass", "no-store") or (
            asked != "force" and not deterministic(req.sampling)
        ):
            await self._count("bypasses")
            choices = await fresh()
            choices.cache = "bypass"
            return choices
        resolved = gateway.targets(req.model, facts, req.context.models, stable=True)
        targets = [self.identity(t) for t in resolved]
        partition = req.context.partition if cfg.scope != "shared" else None
        key, skey, text = request_keys(req, targets, partition)
        now = self.clock()
        answer = await self._call(store.get, key, now, cfg.ttl_s)
        if answer is not None:
            return _replayed(answer, "hit")
        vector = None
        if mode == "semantic" and skey is not None and text is not None:
            vector = await self._vector(cfg, text)
            if vector is not None:
                near = await self._call(
                    store.nearest, skey, vector, cfg.semantic_threshold, now, cfg.ttl_s
                )
                if near is not None:
                    return _replayed(near[0], "semantic")
        await self._count("misses")
        choices = await fresh()
        choices.cache = "miss"

        async def put(answer: CachedAnswer) -> None:
            await self._call(
                store.put,
                key,
                answer,
                self.clock(),
                max_entries=cfg.max_entries,
                ttl_s=cfg.ttl_s,
                skey=skey if vector is not None else None,
                vector=vector,
            )

        return _recording(choices, _Recorder(put, choices.count))

    async def _vector(self, cfg: CacheConfig, text: str) -> list[float] | None:
        """The last user message's vector, or None (semantic mode then acts as exact; one
        warning per embedding model setting, not one per request)."""
        if not cfg.embedding_model or self.embed is None:
            self._warn_once("", "cache.mode is semantic but no cache.embedding_model is set")
            return None
        try:
            # the server's own lookup: a fresh context, not the caller's key scope or limits
            emb = await self.embed(EmbeddingRequest(cfg.embedding_model, (text,)))
        except (
            Exception
        ) as e:  # a missing or failing model: the lookup is exact, the request goes on
            self._warn_once(cfg.embedding_model, f"cannot embed with {cfg.embedding_model}: {e}")
            return None
        return emb.vectors[0] if emb.vectors else None

    def _warn_once(self, what: str, message: str) -> None:
        if what not in self._warned:
            self._warned.add(what)
            log.warning("response cache: %s; it matches exact repeats only", message)

    async def _count(self, counter: str) -> None:
        if self.store is not None:
            await self._call(self.store.count, counter)

    async def _call(self, fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        """A store call off the loop; a failing disk costs the cache, never the request."""
        try:
            return await asyncio.to_thread(fn, *args, **kw)
        except Exception as e:  # sqlite3.Error, OSError: the machine's state
            log.warning("response cache: %s failed: %s", getattr(fn, "__name__", "call"), e)
            return None

    def stats(self) -> dict[str, Any]:
        """``hearth cache stats --json``'s object (blocks: call it off the loop)."""
        cfg = self.config()
        counts = self.store.stats() if self.store is not None else {}
        return stats_object(self.mode(), cfg, counts)

    def close(self) -> None:
        if self.store is not None:
            self.store.close()


def stats_object(mode: str, cfg: CacheConfig, counts: dict[str, int]) -> dict[str, Any]:
    """``{mode, entries, max_entries, ttl_s, hits, semantic_hits, misses, bypasses, bytes}``."""
    return {
        "mode": mode,
        "entries": counts.get("entries", 0),
        "max_entries": cfg.max_entries,
        "ttl_s": cfg.ttl_s,
        "hits": counts.get("hits", 0),
        "semantic_hits": counts.get("semantic_hits", 0),
        "misses": counts.get("misses", 0),
        "bypasses": counts.get("bypasses", 0),
        "bytes": counts.get("bytes", 0),
    }


def _replayed(answer: CachedAnswer, result: str) -> Choices:
    gens = []
    for deltas in answer.choices:
        usage = deltas[-1].usage
        prompt = usage.prompt_tokens if usage is not None else 0
        gens.append(Generation(answer.model, prompt, _Replay(deltas)))
    choices = Choices(gens)
    choices.cache = result
    return choices


def _recording(choices: Choices, recorder: _Recorder) -> Choices:
    """``choices`` with each generation kept as it runs (those not started yet too)."""
    recorder.model = choices.model

    async def start(i: int) -> Generation:
        return recorder.wrap(i, await choices.get(i))

    out = Choices(
        [recorder.wrap(i, g) for i, g in enumerate(choices.started)], choices.count, start
    )
    out.model, out.route, out.cache = choices.model, choices.route, choices.cache
    return out
