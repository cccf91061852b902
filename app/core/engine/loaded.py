"""What the scheduler reports about loaded models and loads (``app.core.engine.scheduler``).
Tested by tests/core/engine/test_autofit.py and tests/core/engine/test_scheduler.py."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from app.core.types import LoadedModel, LoadOptions

LoadAction = Literal["loaded", "reloaded", "unchanged"]


@dataclass(frozen=True, slots=True)
class LoadedInfo:
    model_id: str
    runtime: str
    context_length: int
    loaded_at: float
    last_used: float
    pending: int
    memory_bytes: int
    ttl: float | None
    expires_at: float | None  # when an idle model will unload; None = never / busy
    pinned: bool
    options: LoadOptions
    reload_pending: bool = False  # a reload waits for its running requests to finish
    cache_tokens: int = 0  # the KV cache's cells, all sequences together (context: one's most)
    parallel: int = 1  # requests decoded together
    queue_full: bool = False  # its runtime takes no more requests now (/health's "busy")


@dataclass(frozen=True, slots=True)
class LoadResult:
    """What an explicit load did: ``loaded`` (it was not loaded), ``reloaded`` (it was, with
    other options) or ``unchanged`` (it already was, with these options)."""

    model: LoadedModel
    action: LoadAction
    options: LoadOptions

    @property
    def context_length(self) -> int:
        return self.model.context_length
