"""Resolution: a request's ``model`` -> the ordered targets to try, and trying them.

Order: a local id -> an alias (its targets, aliases expanded depth first) -> a replica group
(all its members, in the order its strategy picks) -> ``auto`` (the rule picked, then
resolved) -> ``default_model`` when the request names none -> 404. Never a silent substitute. Remote ``PREFIX/id`` targets join through ``is_model`` (any id it accepts is a
target as it is).
Tested by tests/core/gateway/test_gateway.py and tests/server/gateway/test_gateway.py."""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from app.core.gateway import telemetry
from app.core.gateway.aliases import AliasStore, find_cycle
from app.core.gateway.auto import AUTO, AutoRule, RequestFacts, pick
from app.core.gateway.groups.router import GroupRouter
from app.core.gateway.retry import is_retryable
from app.core.requests import RequestContext
from app.core.util import access
from app.core.util.access import Patterns
from app.errors import HearthError, InvalidRequest, ModelNotFound, ModelUnloaded

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Routing:
    """The routing settings: the model for requests that name none, and ``auto``'s rules."""

    default_model: str = ""
    auto: tuple[AutoRule, ...] = ()


class Gateway:
    def __init__(
        self,
        aliases: AliasStore | None,
        routing: Callable[[], Routing],
        is_model: Callable[[str], bool],
        is_loaded: Callable[[str], bool],
        groups: GroupRouter | None = None,
    ) -> None:
        self.aliases = aliases
        self.groups = groups
        self._routing = routing
        self._is_model = is_model
        self._is_loaded = is_loaded

    def alias_map(self, name: str = "") -> dict[str, tuple[str, ...]]:
        """The aliases; when ``name`` is neither a model nor a known alias, the file is checked
        at once, so an alias another process (``hearth alias set``) just wrote is found by the
        very next request."""
        if self.aliases is None:
            return {}
        found = self.aliases.all()
        if name and name not in found and not self._is_model(name):
            found = self.aliases.all(fresh=True)
        return found

    @property
    def default_model(self) -> str:
        """The model a request that names none goes to ("" when none is set)."""
        return self._routing().default_model

    def is_routable(self, name: str) -> bool:
        """A name the gateway answers for besides a model id: an alias, a group or ``auto``."""
        return (
            name == AUTO
            or name in self.alias_map(name)
            or (self.groups is not None and self.groups.is_group(name))
        )

    def targets(
        self,
        model: str,
        facts: RequestFacts,
        scope: Patterns = None,
        session: str = "",
        *,
        commit: bool = False,
        stable: bool = False,
    ) -> list[str]:
        """The model ids to try, in order, those in the caller's ``scope`` (a key's patterns).
        A group's members come in the order its strategy picks for this request (``session``:
        its affinity key); ``commit`` takes the turn (round-robin, a half-open trial) as
        :meth:`run` does, where a mere look leaves it. ``stable``: a group's members as
        configured instead (what the response cache keys an answer by: any member's answer is
        the group's, whatever the order of the moment).

        Raises:
            InvalidRequest: no model named and no default_model; ``auto`` matching no rule.
            ModelNotFound: a name that is no model, alias or ``auto``.
        """
        routing = self._routing()
        if not model:
            if not routing.default_model:
                raise InvalidRequest(
                    "'model' must not be empty (no default_model is set)", param="model"
                )
            model = routing.default_model
        if model == AUTO:
            model = pick(routing.auto, facts, lambda name: self._loaded_target(name, scope))
        out: list[str] = []
        self._expand(model, self.alias_map(model), out, (facts, session, commit, stable))
        out = [t for t in out if access.in_scope(t, scope)]  # a key's --models patterns
        if not out:  # the answer an unknown name gets: the key cannot learn the model exists
            raise ModelNotFound(
                f"model '{model}' not found (not a model id or an alias)", param="model"
            )
        return out

    def visible_aliases(self, name: str = "", scope: Patterns = None) -> dict[str, tuple[str, ...]]:
        """The aliases ``scope`` reaches, each listing only the targets it reaches
        (every alias as it is outside a scope); a ``name`` to look up is checked in the file at
        once when it is not known yet (as ``alias_map``)."""
        aliases = self.alias_map(name)
        if not scope:
            return aliases

        def reaches(target: str) -> bool:
            if self._is_model(target) or target not in aliases:
                return access.in_scope(target, scope)
            with contextlib.suppress(HearthError):
                return bool(self.targets(target, RequestFacts(), scope))  # raises: none in scope
            return False

        return {
            alias: tuple(t for t in targets if reaches(t))
            for alias, targets in aliases.items()
            if reaches(alias)
        }

    def _expand(
        self,
        name: str,
        aliases: dict[str, tuple[str, ...]],
        out: list[str],
        how: tuple[RequestFacts, str, bool, bool] = (RequestFacts(), "", False, False),
    ) -> None:
        if self._is_model(name):  # a local id first: an alias never shadows a model
            if name not in out:
                out.append(name)
            return
        targets = aliases.get(name)
        if targets is None and self.groups is not None and self.groups.is_group(name):
            facts, session, commit, stable = how
            members = (
                self.groups.configured(name)
                if stable
                else self.groups.order(name, facts, session, commit=commit)
            )
            out += [t for t in members if t not in out]
            return
        if targets is None:
            raise ModelNotFound(
                f"model '{name}' not found (not a model id or an alias)", param="model"
            )
        cycle = find_cycle(name, aliases)  # the file was edited by hand: say so, do not loop
        if cycle:
            raise InvalidRequest(f"alias cycle: {' -> '.join(cycle)}", param="model")
        for t in targets:
            self._expand(t, aliases, out, how)

    def _loaded_target(self, name: str, scope: Patterns) -> bool:
        try:
            first = self.targets(name, RequestFacts(), scope)[0]
        except HearthError:
            return False
        return self._is_loaded(first)

    async def check(
        self,
        model: str,
        facts: RequestFacts,
        ctx: RequestContext,
        check: Callable[[str], Awaitable[None]],
    ) -> str:
        """``check`` the targets :meth:`run` would start, in its order, without starting any:
        the first that passes ends it (and is returned); a retryable failure moves on (as :meth:`run` would), any
        other is raised, and the last retryable one when none passes."""
        last: HearthError | None = None
        for target in self.targets(model, facts, ctx.models, ctx.session):
            try:
                await check(target)
                return target
            except HearthError as e:
                if not is_retryable(e):
                    raise
                last = e
        if last is None:  # pragma: no cover - targets() never returns an empty list
            raise ModelNotFound(f"model '{model}' has no targets")
        raise last

    async def run(
        self,
        model: str,
        facts: RequestFacts,
        ctx: RequestContext,
        start: Callable[[str], Awaitable[T]],
    ) -> tuple[T, list[str]]:
        """``start`` each target in turn until one starts (its first byte not yet sent); a
        retryable failure moves on, any other answers at once. The result names the model that
        answered and the ids tried: ``(result, route)``, the last of ``route`` answered."""
        route: list[str] = []
        last: HearthError | None = None
        targets = self.targets(model, facts, ctx.models, ctx.session, commit=True)
        for i, target in enumerate(targets):
            route.append(target)
            try:
                with telemetry.attempt(ctx.trace, target, i):  # a span per attempt when traced
                    result = await _start_once_more_if_raced(start, target)
            except HearthError as e:
                if not is_retryable(e):
                    e.route = list(route)  # type: ignore[attr-defined]
                    raise
                last = e
                if i + 1 < len(targets):
                    telemetry.fell_back(ctx.trace, target)
                continue
            if self.groups is not None:
                self.groups.served(facts, target)
            return result, route
        if last is None:  # pragma: no cover - targets() never returns an empty list
            raise ModelNotFound(f"model '{model}' has no targets")
        last.route = route  # type: ignore[attr-defined]
        raise last


async def _start_once_more_if_raced(start: Callable[[str], Awaitable[T]], target: str) -> T:
    """``start(target)``; when an unload raced it (the model was found, then retired before the
    request was submitted, so nothing ran), start it once more: that loads the model again."""
    try:
        return await start(target)
    except ModelUnloaded as e:
        if not e.raced:
            raise
    return await start(target)
