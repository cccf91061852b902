"""ModelScheduler: which models are loaded, within a memory budget, for how long.

Policy, all on the service loop:
- JIT: a request for a model that is not loaded loads it; concurrent requests share one load.
- Budget: loading a model that does not fit evicts the least recently used idle, unpinned
  models; if it still does not fit, the load is refused with the numbers (``force`` loads anyway).
- Keep-alive: an idle model unloads when its TTL runs out (None = never, 0 = as soon as idle);
  the TTL comes from the request, the model's preset, or the global default. Pinned models stay.
- Options: explicit options > the model's preset > global defaults, for JIT loads too.
- Reload: an explicit load whose resolved options differ from the loaded ones reloads the model;
  while requests run on it that is refused (ModelBusy) unless the caller waits for them, and
  new requests for it wait for the reload instead of keeping it busy forever.
- Loads run one at a time on a helper thread; a failed load leaves everything as it was.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from app.core.engine.autofit import ContextChoice, choose_context
from app.core.engine.keep_alive import parse_keep_alive as parse_keep_alive  # re-exported
from app.core.engine.loaded import LoadedInfo, LoadResult
from app.core.engine.policy import SchedulerPolicy
from app.core.engine.presets import PresetStore, apply_options
from app.core.events import EventHub, ModelLoaded, ModelLoadFailed, ModelLoading, ModelUnloaded
from app.core.library import fit, formats
from app.core.library.index import ModelLibrary
from app.core.types import UNSET, LoadedModel, LoadOptions, LocalModel, Runtime
from app.core.util.units import human_bytes
from app.errors import (
    HearthError,
    InsufficientMemory,
    ModelBusy,
    ModelNotFound,
    RuntimeUnavailable,
)
from app.errors import ModelLoadFailed as LoadFailedError

log = logging.getLogger(__name__)

# how often a reload that waits for running requests looks again (they end on the worker thread)
BUSY_POLL_S = 0.05


@dataclass
class _Slot:
    model: LoadedModel
    runtime: str
    options: LoadOptions
    memory: int
    loaded_at: float
    last_used: float
    ttl: float | None
    pinned: bool
    leases: int = 0
    loaded_wall: float = field(default_factory=time.time)

    def busy(self) -> bool:
        return self.leases > 0 or self.model.pending > 0


class ModelScheduler:
    """Loads and unloads models on the service loop (see the module docstring for the policy)."""

    def __init__(
        self,
        library: ModelLibrary,
        runtimes: Mapping[str, Runtime],
        events: EventHub,
        load_defaults: Callable[[], LoadOptions],
        *,
        presets: PresetStore | None = None,
        policy: SchedulerPolicy | None = None,
    ) -> None:
        policy = policy or SchedulerPolicy()
        self._library = library
        self._runtimes = dict(runtimes)
        self._events = events
        self._load_defaults = load_defaults
        self._presets = presets
        self._policy = policy
        self._budget = policy.budget_bytes or fit.default_budget
        self._default_ttl = policy.default_ttl
        self._auto_cap = policy.auto_context_cap
        self._sweep_interval = policy.sweep_interval
        self._clock = policy.clock
        self._slots: dict[str, _Slot] = {}
        self._loading: dict[str, asyncio.Future[LoadedModel]] = {}
        self._loading_memory: dict[str, int] = {}
        # model id -> resolved when its reload is over (new requests for it wait for this)
        self._reloads: dict[str, asyncio.Future[None]] = {}
        self._load_lock: asyncio.Lock | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self._calibrated: dict[str, int] = policy.read_calibration()

    # -- queries ---------------------------------------------------------------------------
    def state(self, model_id: str) -> str:
        if model_id in self._slots:
            return "loaded"
        if model_id in self._loading:
            return "loading"
        return "not-loaded"

    def loading(self) -> list[str]:
        return sorted(self._loading)

    def loaded(self) -> list[LoadedInfo]:
        out = []
        for mid, s in self._slots.items():
            expires = None
            if s.ttl is not None and not s.pinned and not s.busy():
                expires = time.time() + max(0.0, s.last_used + s.ttl - self._clock())
            out.append(
                LoadedInfo(
                    mid,
                    s.runtime,
                    s.model.context_length,
                    s.loaded_wall,
                    time.time() - (self._clock() - s.last_used),
                    s.model.pending,
                    s.memory,
                    s.ttl,
                    expires,
                    s.pinned,
                    s.options,
                    mid in self._reloads,
                    getattr(s.model, "cache_tokens", s.model.context_length),
                    getattr(s.model, "parallel", 1),
                    bool(getattr(s.model, "queue_full", False)),
                )
            )
        return out

    def loaded_model(self, model_id: str) -> LoadedModel | None:
        s = self._slots.get(model_id)
        return s.model if s else None

    def budget(self) -> int:
        return self._budget()

    def used(self) -> int:
        return sum(s.memory for s in self._slots.values()) + sum(self._loading_memory.values())

    def _runtime_for(self, model: LocalModel) -> Runtime:
        rt = self._runtimes.get(model.format)
        if rt is None or not rt.available():
            raise RuntimeUnavailable(
                f"no runtime for {model.format} models on this machine (model '{model.id}')"
            )
        return rt

    def effective_options(
        self, model_id: str, overrides: dict[str, Any] | None = None
    ) -> LoadOptions:
        """Global defaults, then the model's preset, then ``overrides``."""
        opts = self._load_defaults()
        if self._presets is not None:
            opts = apply_options(opts, self._presets.get(model_id))
        return apply_options(opts, overrides or {})

    def _preset_extra(self, model_id: str) -> dict[str, Any]:
        return self._presets.get(model_id) if self._presets is not None else {}

    def estimate(self, model: LocalModel, options: LoadOptions) -> tuple[fit.MemoryEstimate, int]:
        """(the estimate, the figure the budget uses: calibrated from a past load when known)."""
        est = formats.estimate_model(model, options)
        return est, max(est.total, self._calibrated.get(_calib_key(model, options), 0))

    def fit_context(
        self, model: LocalModel, options: LoadOptions, *, replacing: str | None = None
    ) -> ContextChoice:
        """Context 0 (auto) -> the largest that fits the budget free now (app/core/engine/autofit),
        counting idle models as free (a load evicts them) but not busy or pinned ones.
        ``replacing``: a loaded model this load replaces (its memory counts as free)."""
        old = self._slots.get(replacing) if replacing is not None else None
        idle = sum(
            s.memory for s in self._slots.values() if s is old or not s.busy() and not s.pinned
        )
        free = self._budget() - self.used() + idle

        def need(o: LoadOptions) -> tuple[int, int]:
            est, figure = self.estimate(model, o)
            return est.context_length, figure

        return choose_context(options, estimate=need, free_bytes=free, cap=self._auto_cap())

    # -- leases: a model in use by a request being prepared is never unloaded -------------------
    async def acquire(self, model_id: str, *, load: bool = True, ttl: Any = UNSET) -> LoadedModel:
        """The loaded model (JIT-loaded when ``load``), held until ``release``.

        Raises:
            ModelNotFound: unknown id, or not loaded and ``load`` is False.
        """
        await self._after_reload(model_id)
        s = self._slots.get(model_id)
        if s is None:
            if not load and model_id not in self._loading:  # a load in progress is joined
                self._library.get(model_id)  # 404 for unknown ids first
                raise ModelNotFound(
                    f"The model '{model_id}' is not loaded and on-demand loading is off",
                    param="model",
                )
            await self.load(model_id, jit=True)
            s = self._slots.get(model_id)
            if s is None:  # unloaded again in between (e.g. by the user): load once more
                await self.load(model_id, jit=True)
                s = self._slots[model_id]
        s.leases += 1
        s.last_used = self._clock()
        if ttl is not UNSET:
            s.ttl = ttl
        return s.model

    def release(self, model_id: str) -> None:
        s = self._slots.get(model_id)
        if s is not None and s.leases > 0:
            s.leases -= 1
            s.last_used = self._clock()

    async def _after_reload(self, model_id: str) -> None:
        """Wait while a reload of the model is waiting or running (it ends well or not)."""
        while (gate := self._reloads.get(model_id)) is not None:
            await asyncio.wait([gate])

    async def get(self, model_id: str, *, load: bool = True) -> LoadedModel:
        """The loaded model (loading it when ``load``), without holding it."""
        lm = await self.acquire(model_id, load=load)
        self.release(model_id)
        return lm

    # -- load / unload ----------------------------------------------------------------------
    async def load(
        self,
        model_id: str,
        options: dict[str, Any] | LoadOptions | None = None,
        *,
        force: bool = False,
        ttl: Any = UNSET,
        pin: bool | None = None,
        jit: bool = False,
        wait: bool = False,
    ) -> LoadedModel:
        """The loaded model after :meth:`load_result` (same arguments)."""
        result = await self.load_result(
            model_id, options, force=force, ttl=ttl, pin=pin, jit=jit, wait=wait
        )
        return result.model

    async def load_result(
        self,
        model_id: str,
        options: dict[str, Any] | LoadOptions | None = None,
        *,
        force: bool = False,
        ttl: Any = UNSET,
        pin: bool | None = None,
        jit: bool = False,
        wait: bool = False,
    ) -> LoadResult:
        """Load a model, or reload it when it is loaded with other options; say which.

        Args:
            options: None = "have it loaded": a loaded model stays as it is (JIT loads, a chat
                that loads first). Otherwise load options over the preset and defaults (a dict
                of option names, ``{}`` included, or a complete ``LoadOptions``), resolved as a
                fresh load would: the same as the loaded ones -> ``unchanged``; other -> the
                model is reloaded with them.
            force: load even when the budget says it does not fit.
            ttl: seconds idle before unloading (None = never); default: the preset's, else the
                global JIT default for on-demand loads and never for explicit ones (a reload
                keeps the model's).
            pin: keep loaded regardless of TTL and eviction (a reload keeps the model's).
            jit: this load was caused by a request (not asked for explicitly).
            wait: a reload while requests run on the model waits for them to finish (new
                requests wait for the reload) instead of raising ModelBusy.

        Raises:
            ModelNotFound, RuntimeUnavailable, InsufficientMemory, ModelLoadFailed, ModelBusy.
        """
        while True:
            await self._after_reload(model_id)
            s = self._slots.get(model_id)
            if s is not None:
                opts = None if options is None else self._resolve(model_id, options)
                if opts is None or opts == s.options:
                    if pin is not None:
                        s.pinned = pin
                    if ttl is not UNSET:
                        s.ttl = ttl
                    return LoadResult(s.model, "unchanged", s.options)
                return await self._reload(
                    model_id, s, opts, force=force, ttl=ttl, pin=pin, wait=wait
                )
            fut = self._loading.get(model_id)
            if fut is None:
                break
            await asyncio.shield(fut)  # joined a load in progress: compare with what it loaded
        model = self._library.get(model_id)
        runtime = self._runtime_for(model)
        opts = self._resolve(model_id, options)
        extra = self._preset_extra(model_id)
        if ttl is UNSET:
            ttl = extra["ttl"] if "ttl" in extra else (self._default_ttl() if jit else None)
            if ttl is not None and ttl < 0:
                ttl = None
        pinned = bool(extra.get("pinned", False)) if pin is None else pin
        choice = self.fit_context(model, opts)
        if choice.auto:
            log.info("%s: context %d, %s", model_id, choice.options.context_length, choice.reason)
        run = choice.options
        _, memory = self.estimate(model, run)
        await self._make_room(model, memory, force)
        fut = self._start_load(model, runtime, run, memory, ttl, pinned, requested=opts)
        return LoadResult(await asyncio.shield(fut), "loaded", opts)

    def _resolve(self, model_id: str, options: dict[str, Any] | LoadOptions | None) -> LoadOptions:
        if isinstance(options, LoadOptions):
            return options
        return self.effective_options(model_id, options)

    def _start_load(
        self,
        model: LocalModel,
        runtime: Runtime,
        opts: LoadOptions,
        memory: int,
        ttl: float | None,
        pinned: bool,
        *,
        requested: LoadOptions,
    ) -> asyncio.Future[LoadedModel]:
        """``opts``: what the runtime loads with (auto context resolved); ``requested``: the
        options asked for, which the model keeps (a later load compares with them)."""
        fut: asyncio.Future[LoadedModel] = asyncio.get_running_loop().create_future()
        self._loading[model.id] = fut
        self._loading_memory[model.id] = memory
        self._ensure_sweeper()
        asyncio.ensure_future(
            self._do_load(model, runtime, opts, memory, ttl, pinned, fut, requested)
        )
        return fut

    async def _reload(
        self,
        model_id: str,
        s: _Slot,
        opts: LoadOptions,
        *,
        force: bool,
        ttl: Any,
        pin: bool | None,
        wait: bool,
    ) -> LoadResult:
        """Unload ``s`` and load the model again with ``opts``, once nothing runs on it."""
        if s.busy() and not wait:
            n = s.model.pending + s.leases
            raise ModelBusy(
                f"'{model_id}' is loaded with other options and {n} request(s) are running on "
                f"it; a reload would end them. Retry when they finish, or wait for them "
                f'(hearth load --wait, or "wait": true).',
                pending=n,
            )
        model = self._library.get(model_id)
        runtime = self._runtime_for(model)
        gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._reloads[model_id] = gate
        try:
            while s.busy():  # new requests wait at the gate, so only the running ones remain
                await asyncio.sleep(BUSY_POLL_S)
            run = self.fit_context(model, opts, replacing=model_id).options
            _, memory = self.estimate(model, run)
            # refused before the old copy goes, whose memory counts as free for the new one
            await self._make_room(model, memory, force, replacing=model_id)
        except BaseException:
            self._open_gate(model_id, gate)
            raise
        keep_ttl = s.ttl if ttl is UNSET else ttl
        pinned = s.pinned if pin is None else pin
        log.info("reloading %s with new options", model_id)
        # unload and load in a task of their own: a caller that goes away cannot stop it halfway
        task = asyncio.ensure_future(
            self._swap(model, runtime, (run, opts), memory, keep_ttl, pinned, gate)
        )
        task.add_done_callback(lambda t: t.cancelled() or t.exception())
        return await asyncio.shield(task)

    async def _swap(
        self,
        model: LocalModel,
        runtime: Runtime,
        run_opts: tuple[LoadOptions, LoadOptions],  # (what the runtime loads with, requested)
        memory: int,
        ttl: float | None,
        pinned: bool,
        gate: asyncio.Future[None],
    ) -> LoadResult:
        run, opts = run_opts
        try:
            was_loaded = await self.unload(model.id)
            fut = self._start_load(model, runtime, run, memory, ttl, pinned, requested=opts)
        finally:
            self._open_gate(model.id, gate)  # requests now join the load in progress
        return LoadResult(await asyncio.shield(fut), "reloaded" if was_loaded else "loaded", opts)

    def _open_gate(self, model_id: str, gate: asyncio.Future[None]) -> None:
        if self._reloads.get(model_id) is gate:
            del self._reloads[model_id]
        if not gate.done():
            gate.set_result(None)

    async def _make_room(
        self, model: LocalModel, needed: int, force: bool, *, replacing: str | None = None
    ) -> None:
        """Evict idle models until ``needed`` fits, or refuse. ``replacing``: a loaded model
        about to be unloaded for this load (its memory counts as free; it is not evicted)."""
        budget = self._budget()
        old = self._slots.get(replacing) if replacing is not None else None
        held = old.memory if old is not None else 0

        def used() -> int:
            return self.used() - held

        if used() + needed <= budget:
            return
        evictable = sorted(
            (s for s in self._slots.values() if not s.pinned and not s.busy() and s is not old),
            key=lambda s: s.last_used,
        )
        freed = sum(s.memory for s in evictable)
        if used() - freed + needed > budget and not force:
            available = max(0, budget - (used() - freed))
            raise InsufficientMemory(
                f"'{model.id}' needs about {human_bytes(needed)} but only {human_bytes(available)} of the "
                f"{human_bytes(budget)} memory budget can be freed (loaded models that are busy or pinned "
                f"stay). Unload a model, raise the budget, lower the context, or load anyway (force).",
                needed=needed,
                available=available,
            )
        for s in evictable:
            if used() + needed <= budget:
                break
            mid = next(k for k, v in self._slots.items() if v is s)
            log.info("evicting %s (least recently used) to make room for %s", mid, model.id)
            await self.unload(mid)

    async def _do_load(
        self,
        model: LocalModel,
        runtime: Runtime,
        options: LoadOptions,
        memory: int,
        ttl: float | None,
        pinned: bool,
        fut: asyncio.Future[LoadedModel],
        requested: LoadOptions,
    ) -> None:
        self._events.publish(ModelLoading(model.id))
        if self._load_lock is None:
            self._load_lock = asyncio.Lock()
        t0 = time.perf_counter()
        try:
            async with self._load_lock:  # one at a time: memory is measured per load
                lm, measured = await asyncio.to_thread(_load_measured, runtime, model, options)
        except Exception as e:
            self._loading.pop(model.id, None)
            self._loading_memory.pop(model.id, None)
            err = (
                e
                if isinstance(e, HearthError)
                else LoadFailedError(f"loading '{model.id}' failed: {e}")
            )
            if not isinstance(e, HearthError):
                log.exception("loading %s failed", model.id)
            self._events.publish(ModelLoadFailed(model.id, err.message))
            fut.set_exception(err)
            fut.exception()  # mark retrieved: waiters may all have gone
            return
        key = _calib_key(model, options)
        if measured > memory:
            # the real footprint is larger than the estimate: remember it for next time
            self._calibrated[key] = measured
            self._policy.save_calibration(self._calibrated)
            log.info(
                "%s: measured %s after load, estimated %s",
                model.id,
                human_bytes(measured),
                human_bytes(memory),
            )
            memory = measured
        now = self._clock()
        self._slots[model.id] = _Slot(lm, runtime.name, requested, memory, now, now, ttl, pinned)
        self._loading.pop(model.id, None)
        self._loading_memory.pop(model.id, None)
        secs = time.perf_counter() - t0
        log.info("loaded %s in %.2fs (context %d)", model.id, secs, lm.context_length)
        self._events.publish(ModelLoaded(model.id, lm.context_length, secs))
        fut.set_result(lm)

    async def unload(self, model_id: str) -> bool:
        """Unload a model; running and queued requests on it end as cancelled."""
        fut = self._loading.get(model_id)
        if fut is not None:
            try:
                await asyncio.shield(fut)
            except HearthError:
                return False
        s = self._slots.pop(model_id, None)
        if s is None:
            return False
        await asyncio.to_thread(s.model.close)
        self._events.publish(ModelUnloaded(model_id))
        log.info("unloaded %s", model_id)
        return True

    def set_pinned(self, model_id: str, pinned: bool) -> None:
        s = self._slots.get(model_id)
        if s is None:
            raise ModelNotFound(f"The model '{model_id}' is not loaded", param="model")
        s.pinned = pinned

    def set_ttl(self, model_id: str, ttl: float | None) -> None:
        s = self._slots.get(model_id)
        if s is None:
            raise ModelNotFound(f"The model '{model_id}' is not loaded", param="model")
        s.ttl = ttl
        s.last_used = self._clock()

    # -- keep-alive ---------------------------------------------------------------------------
    def _ensure_sweeper(self) -> None:
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = asyncio.ensure_future(self._sweep_forever())

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(self._sweep_interval)
            try:
                await self.sweep()
            except Exception:
                log.exception("keep-alive sweep failed")

    async def sweep(self) -> list[str]:
        """Unload idle models whose TTL ran out. Returns their ids."""
        now = self._clock()
        expired = []
        for mid, s in list(self._slots.items()):
            if s.busy():
                s.last_used = now  # idle time counts from the end of the last request
                continue
            if s.pinned or s.ttl is None:
                continue
            if now - s.last_used >= s.ttl:
                expired.append(mid)
        for mid in expired:
            log.info("unloading %s: idle past its keep-alive", mid)
            await self.unload(mid)
        return expired

    async def close(self) -> None:
        for rt in self._runtimes.values():  # first: loads still checking a file end now
            close = getattr(rt, "close", None)  # optional: runtimes with child processes
            if callable(close):
                close()
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._sweeper
        for mid in list(self._slots):
            await self.unload(mid)


def _load_measured(
    runtime: Runtime, model: LocalModel, options: LoadOptions
) -> tuple[LoadedModel, int]:
    before = fit.current_rss()
    lm = runtime.load(model, options)
    return lm, max(0, fit.current_rss() - before)


def _calib_key(model: LocalModel, options: LoadOptions) -> str:
    return (
        f"{model.id}|{model.size_bytes}|{options.context_length}|{options.kv_type}|"
        f"{options.ubatch_size or options.batch_size}|{options.use_mmap}"
    )
