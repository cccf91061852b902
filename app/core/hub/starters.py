"""Starter models for the first run: a short curated list of well-known small GGUF
repos, each looked up on the Hub with the chosen file's size and whether it fits this machine's
memory budget. Nothing is downloaded here; the caller queues the one the user picks.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, replace

from app.core.hub.catalog import RepoInfo, choose
from app.core.hub.client import HubClient
from app.core.library import fit as fitlib
from app.core.library.formats import ModelOption
from app.errors import HearthError, HubUnavailable

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Starter:
    repo_id: str
    quant: str  # the quantization offered (a good size/quality trade-off for small models)
    blurb: str


# well-known, ungated, small instruct models, best first; the list only names them: the Hub
# says what each file is and weighs today
STARTERS: tuple[Starter, ...] = (
    Starter("Qwen/Qwen2.5-1.5B-Instruct-GGUF", "Q4_K_M", "A capable small all-rounder"),
    Starter("Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF", "Q4_K_M", "For code, in your editor"),
    Starter("bartowski/Llama-3.2-3B-Instruct-GGUF", "Q4_K_M", "Meta's small chat model"),
    Starter("bartowski/gemma-2-2b-it-GGUF", "Q4_K_M", "Google's small chat model"),
    Starter("HuggingFaceTB/SmolLM2-1.7B-Instruct-GGUF", "Q4_K_M", "Small and fast"),
    Starter("Qwen/Qwen2.5-0.5B-Instruct-GGUF", "Q4_K_M", "Tiny: for slow or busy machines"),
)
MAX_SUGGESTIONS = 4
FIT_ORDER = {"fits-gpu": 0, "fits-ram": 0, None: 1, "too-large": 2}


@dataclass(frozen=True, slots=True)
class Suggestion:
    """A starter as the Hub has it: its repo, the option offered (with size and ``fit``)."""

    starter: Starter
    info: RepoInfo
    option: ModelOption

    @property
    def fits(self) -> bool:
        return self.option.fit in ("fits-gpu", "fits-ram")


def budget_memory(memory: fitlib.DeviceMemory, budget: int) -> fitlib.DeviceMemory:
    """What a model may use here: free memory, but never more than the models' budget."""
    if budget <= 0:
        return memory
    return replace(
        memory,
        ram_available=min(memory.ram_available, budget),
        gpus=tuple((name, min(free, budget)) for name, free in memory.gpus),
    )


async def suggest(
    hub: HubClient,
    budget: int,
    starters: tuple[Starter, ...] = STARTERS,
    *,
    limit: int = MAX_SUGGESTIONS,
) -> tuple[list[Suggestion], int]:
    """The starters that fit (best first, at most ``limit``) and how many were left out because
    they do not fit the budget. A repo that is gone or has no such file is skipped (logged).

    Raises:
        HubUnavailable: the Hub could not be reached for any of them (offline).
    """
    memory = budget_memory(await asyncio.to_thread(hub.memory_probe), budget)

    async def one(s: Starter) -> Suggestion | HearthError:
        try:
            info = await hub.repo(s.repo_id, with_fit=False)
            option = choose(info, quant=s.quant)
            option = await hub.fit_option(info, option, memory)
        except HearthError as e:
            log.info("starter %s skipped: %s", s.repo_id, e.message)
            return e
        return Suggestion(s, info, option)

    results = await asyncio.gather(*(one(s) for s in starters))
    found = [r for r in results if isinstance(r, Suggestion)]
    if not found:
        offline = next((r for r in results if isinstance(r, HubUnavailable)), None)
        if offline is not None:
            raise offline
    ranked = sorted(found, key=lambda s: FIT_ORDER.get(s.option.fit, 1))  # stable: list order
    shown = [s for s in ranked if s.option.fit != "too-large"][:limit]
    too_large = sum(1 for s in found if s.option.fit == "too-large")
    return shown, too_large
