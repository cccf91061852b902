"""Groups at work: a group's name -> all its members as targets, in the order its strategy
picks among the healthy ones (then, only when none is healthy, the others), for the gateway's
usual loop to try in turn; the member that served a prefix remembered; active health checks
of each member's provider (every ``health_interval_s``, a GET of ``health_path``).
Tested by tests/core/gateway/groups/test_router.py and
tests/e2e/providers/test_replica_groups.py."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from app.core.gateway.auto import RequestFacts
from app.core.gateway.groups import strategies
from app.core.gateway.groups.health import (
    COOLING,
    DEFAULT_COOLDOWN_S,
    HALF_OPEN,
    OPEN,
    READY,
    UNREACHABLE,
)
from app.core.gateway.groups.store import (
    DEFAULT_FAILURES_TO_OPEN,
    GroupConfig,
    GroupStore,
    member_targets,
)
from app.core.gateway.providers.pool import ProviderPool
from app.core.util import access
from app.core.util.access import Patterns

log = logging.getLogger(__name__)

# the kinds whose engines answer GET /health; any other is checked with its model list
HEALTH_KINDS = ("llama.cpp", "vllm", "sglang", "hearth", "tgi")


def default_health_path(kind: str) -> str:
    return "/health" if kind in HEALTH_KINDS else "/v1/models"


class GroupRouter:
    """The groups of this gateway over the provider pool (see the module doc). ``taken(name)``
    names what a group name would clash with (a library id, an alias), or None."""

    def __init__(
        self,
        store: GroupStore,
        pool: ProviderPool,
        taken: Callable[[str], str | None] = lambda _n: None,
    ) -> None:
        self.store = store
        self._pool = pool
        self._taken = taken
        self._turns: dict[str, int] = {}
        self._prefixes: dict[str, strategies.PrefixMemory] = {}
        self._checks: dict[str, asyncio.Task[None]] = {}
        pool.circuits.settings = self._circuit_settings

    # -- names ---------------------------------------------------------------------------------
    def is_group(self, name: str) -> bool:
        return self.store.get(name) is not None

    def names(self) -> list[str]:
        return list(self.store.all())

    def visible(self, scope: Patterns = None) -> dict[str, list[str]]:
        """Each group ``scope`` reaches (its name) and its members' targets in scope."""
        out: dict[str, list[str]] = {}
        for cfg in self.store.all().values():
            targets = [t for t in self.members(cfg) if access.in_scope(t, scope)]
            if access.in_scope(cfg.name, scope) and targets:
                out[cfg.name] = targets
        return out

    def configured(self, name: str) -> list[str]:
        """Group ``name``'s members as configured (no health, no strategy); [] for no group."""
        cfg = self.store.get(name)
        return self.members(cfg) if cfg is not None else []

    def _provider(self, target: str) -> str | None:
        e = self._pool.owner(target)
        return e.cfg.name if e is not None else None

    def members(self, cfg: GroupConfig) -> list[str]:
        """The group's members as targets (a provider's name as ``PREFIX + group name``)."""
        configs = self._pool.store.all()
        return member_targets(cfg, lambda n: configs[n].prefix if n in configs else None)

    # -- routing -------------------------------------------------------------------------------
    def order(
        self, name: str, facts: RequestFacts, session: str = "", *, commit: bool = True
    ) -> list[str]:
        """Every member of group ``name`` to try, in order: the healthy ones (a half-open
        one's single trial included) as the strategy puts them; the others only when none is
        healthy. [] for a name that is no group. Without ``commit`` nothing is taken (the
        round-robin turn, a half-open trial): a look at the order, not a request."""
        cfg = self.store.get(name)
        if cfg is None:
            return []
        self._ensure_checks()
        healthy: list[str] = []
        others: list[str] = []
        for t in self.members(cfg):
            p = self._provider(t)
            ok = p is None or (self._probed_up(p) and self._pool.circuits.state(p) == READY)
            if p is not None and not ok and self._probed_up(p) and self._pool.circuits.available(p):
                # half-open: this request is its one trial
                ok = self._pool.circuits.admits(p) if commit else True
            (healthy if ok else others).append(t)
        return self._arrange(cfg, healthy or others, facts, session, commit)

    def _probed_up(self, provider: str) -> bool:
        """Whether this gateway's own probe of ``provider`` found it up (or is still under way)."""
        e = self._pool.find(provider)
        return e is not None and e.state in ("ready", "starting")

    def _arrange(
        self, cfg: GroupConfig, members: list[str], facts: RequestFacts, session: str, commit: bool
    ) -> list[str]:
        circuits = self._pool.circuits
        busy = strategies.least_busy(
            members,
            self._pool.in_flight.get,
            lambda t: circuits.recent_errors(self._provider(t) or ""),
        )
        if cfg.strategy == "round-robin":
            turn = self._turns.get(cfg.name, 0)
            if commit:
                self._turns[cfg.name] = turn + 1
            return strategies.rotated(members, turn)
        if cfg.strategy == "session" and session:
            return strategies.ring_order(members, session)
        if cfg.strategy == "prefix":
            hashes = strategies.prefix_hashes(facts.text, cfg.prefix_tokens)
            seen = self._memory(cfg.name).lookup(hashes)
            flight = self._pool.in_flight.get
            if (
                seen is not None
                and seen in members
                and not strategies.overloaded(flight(seen), flight(busy[0]) if busy else 0)
            ):
                return [seen, *(m for m in busy if m != seen)]
        return busy

    def served(self, facts: RequestFacts, target: str) -> None:
        """``target`` answered a request (named as the group, through an alias, or directly):
        each ``prefix`` group it is a member of remembers it as the replica holding that
        conversation's prefix."""
        for cfg in self.store.all().values():
            if cfg.strategy == "prefix" and target in self.members(cfg):
                hashes = strategies.prefix_hashes(facts.text, cfg.prefix_tokens)
                self._memory(cfg.name).remember(hashes, target)

    def _memory(self, name: str) -> strategies.PrefixMemory:
        return self._prefixes.setdefault(name, strategies.PrefixMemory())

    # -- editing -------------------------------------------------------------------------------
    def set(self, cfg: GroupConfig) -> GroupConfig:
        """Create or replace a group (InvalidRequest: a bad setting, an unknown member, a name
        that clashes with a library id, an alias, ``auto`` or a provider prefix)."""
        return self.store.set(cfg, self._pool.store.all(fresh=True), self._taken)

    def remove(self, name: str) -> bool:
        self._prefixes.pop(name, None)
        return self.store.remove(name)

    # -- health --------------------------------------------------------------------------------
    def statuses(self) -> list[dict[str, Any]]:
        """Each group, its settings and each member's state (ready / open / half-open /
        cooling / unreachable / unknown) and requests in flight from this gateway. Asking
        starts the active checks of a member not checked yet (as the server starts, too)."""
        self._ensure_checks()
        out = []
        for cfg in self.store.all().values():
            item = cfg.as_json()
            item["members"] = [
                self._member_status(m, t)
                for m, t in zip(cfg.members, self.members(cfg), strict=True)
            ]
            out.append(item)
        return out

    def _member_status(self, member: str, target: str) -> dict[str, Any]:
        p = self._provider(target)
        state, error = "unknown", "no such provider"
        if p is not None:
            state = self._pool.circuits.state(p)
            h = self._pool.circuits.detail(p)
            error = h.error if h is not None and state != READY else ""
            probe = self._pool.entry(p).probe
            if state == READY and probe is not None and probe.state == UNREACHABLE:
                state, error = UNREACHABLE, probe.error or ""
        return {
            "member": member,
            "target": target,
            "provider": p,
            "state": state,
            "in_flight": self._pool.in_flight.get(target),
            "error": error or None,
        }

    def _group_of(self, provider: str) -> GroupConfig | None:
        for cfg in self.store.all().values():
            if any(self._provider(t) == provider for t in self.members(cfg)):
                return cfg
        return None

    def _circuit_settings(self, provider: str) -> tuple[int, float]:
        cfg = self._group_of(provider)  # a provider in several groups: the first one's
        if cfg is None:
            return DEFAULT_FAILURES_TO_OPEN, DEFAULT_COOLDOWN_S
        return cfg.failures_to_open, cfg.cooldown_s

    def _ensure_checks(self) -> None:
        """An active check task for each member's provider (on the service loop only)."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return
        wanted = {
            p
            for cfg in self.store.all().values()
            for t in self.members(cfg)
            if (p := self._provider(t)) is not None
        }
        for p in wanted:
            task = self._checks.get(p)
            if task is None or task.done():
                self._checks[p] = asyncio.ensure_future(self._check_forever(p))

    async def _check_forever(self, provider: str) -> None:
        while True:
            cfg = self._group_of(provider)
            e = self._pool.find(provider)
            if cfg is None or e is None:
                return  # no group names it any more (a later request starts it again)
            path = cfg.health_path or default_health_path(e.cfg.kind)
            answer = await e.client.check(path, cfg.health_timeout_s)
            self.checked(provider, answer.status, answer.body, path)
            await asyncio.sleep(cfg.health_interval_s)

    def checked(self, provider: str, status: int, body: Any, path: str) -> None:
        """One active check's answer: a 2xx closes a half-open (or unreachable) circuit; any
        other answer, or none, counts a failure. An open circuit waits out its cool-down."""
        circuits = self._pool.circuits
        state = circuits.state(provider)
        if 200 <= status < 300:
            if state not in (OPEN, COOLING):
                circuits.success(provider)
            return
        why = f"HTTP {status}" if status else str(body or "no answer")[:200]
        if state in (READY, HALF_OPEN, UNREACHABLE):
            circuits.failure(provider, f"health check {path}: {why}")

    async def close(self) -> None:
        for task in self._checks.values():
            task.cancel()
        for task in self._checks.values():
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._checks.clear()
