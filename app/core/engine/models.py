"""The models concern, as the GUI, the server and the CLI use it: the library's models and
their state, presets, memory estimates, and loading and unloading.

Every lookup by id takes the caller's ``scope`` (a key's model patterns; None: every model):
a model outside it is answered exactly as an unknown one, and is never loaded.
Tested by tests/core/engine/test_scheduler.py and tests/core/library/test_stores.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from app.core.engine.loaded import LoadedInfo, LoadResult
from app.core.engine.presets import PresetStore
from app.core.engine.scheduler import ModelScheduler
from app.core.events import EventHub, LibraryChanged
from app.core.library.changes import IndexChanges
from app.core.library.index import ModelLibrary
from app.core.library.stores import ForeignLocations
from app.core.types import UNSET, LoadedModel, LoadOptions, LocalModel, ModelStatus
from app.core.util import access
from app.core.util.access import Patterns
from app.errors import InvalidRequest


class ModelService:
    """The library's models, their presets, and the scheduler's loads, behind one face."""

    def __init__(
        self,
        library: ModelLibrary,
        scheduler: ModelScheduler,
        events: EventHub,
        presets: PresetStore | None = None,
        foreign: ForeignLocations | None = None,
    ) -> None:
        self._library = library
        self._scheduler = scheduler
        self._events = events
        self._presets = presets
        self._foreign = foreign
        self.folder: Path = library.models_dir  # where Hearth keeps the models it downloads
        self.changes = IndexChanges(library, events)  # other processes' edits, as events

    # -- the library ---------------------------------------------------------------------------
    def all(self, scope: Patterns = None) -> list[ModelStatus]:
        """Every model in the library that ``scope`` reaches, with its load state."""
        return [self._status(m) for m in access.visible(self._library.list(), _id, scope)]

    def get(self, model_id: str, scope: Patterns = None) -> LocalModel:
        """The library's model as the caller may see it: ModelNotFound for an unknown id, and
        the same for one outside ``scope``."""
        access.check(model_id, scope)
        return self._library.get(model_id)

    def status(self, model_id: str, scope: Patterns = None) -> ModelStatus:
        return self._status(self.get(model_id, scope))

    def _status(self, m: LocalModel) -> ModelStatus:
        info = next((i for i in self._scheduler.loaded() if i.model_id == m.id), None)
        return ModelStatus(
            m,
            self._scheduler.state(m.id),
            info.context_length if info else None,
            info.runtime if info else None,
            info.memory_bytes if info else None,
        )

    def import_path(self, path: str | Path, *, copy: bool = False) -> tuple[LocalModel, bool]:
        """Index a model file or folder (``copy``: into the models folder); ``(model, new)``."""
        model, created = self._library.import_path(path, copy=copy)
        if created:
            self._events.publish(LibraryChanged())
        return model, created

    async def resolve(self, id_or_path: str) -> LocalModel:
        """A library id, or a path to a model file/folder (imported on the fly)."""
        p = Path(id_or_path).expanduser()
        if ("/" in id_or_path or id_or_path.endswith(".gguf")) and p.exists():
            return (await asyncio.to_thread(self.import_path, p))[0]
        return self._library.get(id_or_path)

    async def remove(self, model_id: str, *, delete_file: bool = False) -> tuple[LocalModel, bool]:
        """Unload and forget a model; ``delete_file`` confirms deleting another app's file."""
        await self._scheduler.unload(model_id)
        result = self._library.remove(model_id, delete_file=delete_file)
        self._events.publish(LibraryChanged())
        return result

    async def scan_foreign(self) -> list[LocalModel]:
        """Index the models the HF cache, LM Studio and Ollama hold (in place). Returns new ones."""
        if self._foreign is None:
            return []
        added = await asyncio.to_thread(self._library.index_foreign, self._foreign)
        self._events.publish(LibraryChanged())
        return added

    # -- presets and estimates -----------------------------------------------------------------
    def preset(self, model_id: str, scope: Patterns = None) -> dict[str, Any]:
        self.get(model_id, scope)
        return self._presets.get(model_id) if self._presets is not None else {}

    def save_preset(
        self, model_id: str, raw: dict[str, Any], scope: Patterns = None
    ) -> dict[str, Any]:
        """Replace the model's preset (validated by the store); {} clears it."""
        self.get(model_id, scope)
        if self._presets is None:
            raise InvalidRequest("presets are not available in this server")
        return self._presets.set(model_id, raw)

    def effective_options(
        self, model_id: str, overrides: dict[str, Any] | None = None
    ) -> LoadOptions:
        """The options a load of ``model_id`` would use: defaults, its preset, ``overrides``."""
        return self._scheduler.effective_options(model_id, overrides)

    def estimate(
        self, model_id: str, options: dict[str, Any] | None = None, scope: Patterns = None
    ) -> dict[str, Any]:
        """The memory a load would take with these options, against the budget."""
        model = self.get(model_id, scope)
        loaded = self._scheduler.loaded_model(model_id) is not None
        opts = self._scheduler.effective_options(model_id, options)
        choice = self._scheduler.fit_context(model, opts, replacing=model_id if loaded else None)
        est, figure = self._scheduler.estimate(model, choice.options)
        used = self._scheduler.used()
        budget = self._scheduler.budget()
        return {
            **est.as_dict(),
            "calibrated_total": figure,
            "budget": budget,
            "used": used,
            "fits": loaded or used + figure <= budget,
            "context_reason": choice.reason,  # auto-fit's choice, or "set explicitly"
        }

    # -- loading -------------------------------------------------------------------------------
    async def load(
        self,
        model_id: str,
        options: dict[str, Any] | LoadOptions | None = None,
        *,
        force: bool = False,
        ttl: Any = UNSET,
        pin: bool | None = None,
        wait: bool = False,
        scope: Patterns = None,
    ) -> LoadedModel:
        """Load (or reload) a model now (see :meth:`load_result`)."""
        result = await self.load_result(
            model_id, options, force=force, ttl=ttl, pin=pin, wait=wait, scope=scope
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
        wait: bool = False,
        scope: Patterns = None,
    ) -> LoadResult:
        """Like :meth:`load`, saying whether it loaded, reloaded or left the model unchanged."""
        self.get(model_id, scope)
        return await self._scheduler.load_result(
            model_id, options, force=force, ttl=ttl, pin=pin, wait=wait
        )

    async def unload(self, model_id: str, scope: Patterns = None) -> bool:
        if self._library.has(model_id):
            self.get(model_id, scope)  # a model outside the key's scope: as unknown
        return await self._scheduler.unload(model_id)

    def loaded(self, scope: Patterns = None) -> list[LoadedInfo]:
        """The models in memory, with their options, TTL and pending requests."""
        return access.visible(self._scheduler.loaded(), lambda i: i.model_id, scope)

    def loading(self, scope: Patterns = None) -> list[str]:
        return [m for m in self._scheduler.loading() if access.in_scope(m, scope)]

    def memory(self) -> dict[str, int]:
        """The memory budget for models and what the loaded ones use."""
        return {"budget": self._scheduler.budget(), "used": self._scheduler.used()}

    def set_pinned(self, model_id: str, pinned: bool, scope: Patterns = None) -> None:
        self.get(model_id, scope)
        self._scheduler.set_pinned(model_id, pinned)

    def set_ttl(self, model_id: str, ttl: float | None) -> None:
        """How long ``model_id`` stays loaded once idle (None: until unloaded)."""
        self._scheduler.set_ttl(model_id, ttl)

    async def close(self) -> None:
        await self._scheduler.close()


def _id(m: LocalModel) -> str:
    return m.id


def speech_models(listed: Iterable[ModelStatus]) -> list[str]:
    """The ids of the speech-to-text models among ``listed`` (``ModelService.all()``), sorted."""
    return sorted(s.model.id for s in listed if "transcription" in s.model.capabilities)
