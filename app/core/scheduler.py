"""ModelScheduler: owns which models are loaded; loads on demand, exactly once per model."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from app.core.events import EventHub, ModelLoaded, ModelLoadFailed, ModelLoading, ModelUnloaded
from app.core.library import ModelLibrary
from app.core.types import LoadedModel, LoadOptions, LocalModel, Runtime
from app.errors import HearthError, ModelNotFound, RuntimeUnavailable
from app.errors import ModelLoadFailed as LoadFailedError

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LoadedInfo:
    model_id: str
    runtime: str
    context_length: int
    loaded_at: float
    last_used: float
    pending: int


class ModelScheduler:
    """Loads and unloads models. Runs on the service loop; loads happen on a helper thread.

    Concurrent requests for a model that is not loaded share one load (single flight).
    """

    def __init__(
        self,
        library: ModelLibrary,
        runtimes: Mapping[str, Runtime],
        events: EventHub,
        load_defaults: Callable[[], LoadOptions],
    ) -> None:
        self._library = library
        self._runtimes = dict(runtimes)
        self._events = events
        self._load_defaults = load_defaults
        self._loaded: dict[str, tuple[LoadedModel, str, float]] = {}
        self._last_used: dict[str, float] = {}
        self._loading: dict[str, asyncio.Future[LoadedModel]] = {}

    def state(self, model_id: str) -> str:
        if model_id in self._loaded:
            return "loaded"
        if model_id in self._loading:
            return "loading"
        return "not-loaded"

    def loading(self) -> list[str]:
        return sorted(self._loading)

    def loaded(self) -> list[LoadedInfo]:
        return [
            LoadedInfo(mid, rt, lm.context_length, at, self._last_used.get(mid, at), lm.pending)
            for mid, (lm, rt, at) in self._loaded.items()
        ]

    def loaded_model(self, model_id: str) -> LoadedModel | None:
        entry = self._loaded.get(model_id)
        return entry[0] if entry else None

    def runtime_for(self, model: LocalModel) -> Runtime:
        rt = self._runtimes.get(model.format)
        if rt is None or not rt.available():
            raise RuntimeUnavailable(
                f"no runtime for {model.format} models on this machine (model '{model.id}')"
            )
        return rt

    async def get(self, model_id: str, *, load: bool = True) -> LoadedModel:
        """The loaded model, loading it first when ``load`` (JIT).

        Raises:
            ModelNotFound: unknown id, or not loaded and ``load`` is False.
        """
        entry = self._loaded.get(model_id)
        if entry is not None:
            self._last_used[model_id] = time.time()
            return entry[0]
        if not load:
            self._library.get(model_id)  # 404 for unknown ids first
            raise ModelNotFound(
                f"The model '{model_id}' is not loaded and on-demand loading is off", param="model"
            )
        return await self.load(model_id)

    async def load(self, model_id: str, options: LoadOptions | None = None) -> LoadedModel:
        """Load a model (a no-op when loaded; joins a load in progress)."""
        entry = self._loaded.get(model_id)
        if entry is not None:
            return entry[0]
        fut = self._loading.get(model_id)
        if fut is None:
            model = self._library.get(model_id)
            runtime = self.runtime_for(model)
            fut = asyncio.get_running_loop().create_future()
            self._loading[model_id] = fut
            asyncio.ensure_future(
                self._do_load(model, runtime, options or self._load_defaults(), fut)
            )
        return await asyncio.shield(fut)

    async def _do_load(
        self,
        model: LocalModel,
        runtime: Runtime,
        options: LoadOptions,
        fut: asyncio.Future[LoadedModel],
    ) -> None:
        self._events.publish(ModelLoading(model.id))
        t0 = time.perf_counter()
        try:
            lm = await asyncio.to_thread(runtime.load, model, options)
        except Exception as e:
            self._loading.pop(model.id, None)
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
        now = time.time()
        self._loaded[model.id] = (lm, runtime.name, now)
        self._last_used[model.id] = now
        self._loading.pop(model.id, None)
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
        entry = self._loaded.pop(model_id, None)
        if entry is None:
            return False
        await asyncio.to_thread(entry[0].close)
        self._events.publish(ModelUnloaded(model_id))
        log.info("unloaded %s", model_id)
        return True

    async def close(self) -> None:
        for mid in list(self._loaded):
            await self.unload(mid)
