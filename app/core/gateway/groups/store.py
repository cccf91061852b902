"""Groups in ``groups.json`` in the config folder (atomic writes under a file lock; read through
a shared FileCache, so a running server sees ``hearth providers group`` within a second).

A member is a provider's target ``PREFIX/remote-id``, or a bare provider NAME standing for
that provider's ``PREFIX + GROUP-NAME``.
Tested by tests/core/gateway/groups/test_store.py."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from app.core.gateway.aliases import check_name
from app.core.gateway.groups.health import DEFAULT_COOLDOWN_S, DEFAULT_FAILURES_TO_OPEN
from app.core.gateway.providers.store import ProviderConfig
from app.core.util import filecache
from app.core.util.filecache import FileCache
from app.core.util.fsutil import atomic_write_json, file_lock, read_json
from app.errors import InvalidRequest

log = logging.getLogger(__name__)

STRATEGIES = ("least-busy", "session", "prefix", "round-robin")
MAX_MEMBERS = 32


@dataclass(frozen=True, slots=True)
class GroupConfig:
    """One group. ``health_path`` "" means the kind's default (``/health`` or ``/v1/models``)."""

    name: str
    members: tuple[str, ...]
    strategy: str = "least-busy"
    prefix_tokens: int = 256
    health_interval_s: float = 5.0
    health_timeout_s: float = 2.0
    health_path: str = ""
    cooldown_s: float = DEFAULT_COOLDOWN_S
    failures_to_open: int = DEFAULT_FAILURES_TO_OPEN

    def as_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["members"] = list(self.members)
        return out


def check(cfg: GroupConfig) -> GroupConfig:
    """The config when its settings are in bounds (InvalidRequest naming the field otherwise)."""
    check_name(cfg.name)
    if not cfg.members:
        raise InvalidRequest("a group needs at least one member", param="members")
    if len(cfg.members) > MAX_MEMBERS:
        raise InvalidRequest(f"a group has at most {MAX_MEMBERS} members", param="members")
    if len(set(cfg.members)) != len(cfg.members):
        raise InvalidRequest("a group lists each member once", param="members")
    if cfg.strategy not in STRATEGIES:
        raise InvalidRequest(
            f"unknown strategy '{cfg.strategy}' (one of {', '.join(STRATEGIES)})", param="strategy"
        )
    bounds: tuple[tuple[str, float, float, float], ...] = (
        ("prefix_tokens", cfg.prefix_tokens, 16, 32_768),
        ("health_interval_s", cfg.health_interval_s, 0.5, 3_600),
        ("health_timeout_s", cfg.health_timeout_s, 0.1, 60),
        ("cooldown_s", cfg.cooldown_s, 0.5, 3_600),
        ("failures_to_open", cfg.failures_to_open, 1, 100),
    )
    for name, v, lo, hi in bounds:
        if not lo <= v <= hi:
            raise InvalidRequest(f"'{name}' must be in [{lo:g}, {hi:g}]", param=name)
    if cfg.health_path and (
        not cfg.health_path.startswith("/")
        or any(c.isspace() or c in "?#" for c in cfg.health_path)
    ):
        raise InvalidRequest("'health_path' is a path such as /health", param="health_path")
    return replace(cfg, members=tuple(m.strip() for m in cfg.members))


def from_json(name: str, item: Any) -> GroupConfig:
    """A group from its JSON object (InvalidRequest on a wrong type or a bad value)."""
    if not isinstance(item, dict):
        raise InvalidRequest("a group is a JSON object")
    known = {f.name for f in fields(GroupConfig)} - {"name"}
    unknown = sorted(set(item) - known)
    if unknown:
        raise InvalidRequest(f"unknown field '{unknown[0]}'", param=unknown[0])
    members = item.get("members")
    if not isinstance(members, list) or not all(isinstance(m, str) for m in members):
        raise InvalidRequest("'members' is a list of provider targets or names", param="members")
    kw: dict[str, Any] = {"members": tuple(members)}
    for key, typ in (
        ("strategy", str),
        ("health_path", str),
        ("prefix_tokens", int),
        ("failures_to_open", int),
        ("health_interval_s", float),
        ("health_timeout_s", float),
        ("cooldown_s", float),
    ):
        if key not in item:
            continue
        v = item[key]
        ok = isinstance(v, str) if typ is str else isinstance(v, int | float)
        if not ok or isinstance(v, bool) or (typ is int and v != int(v)):
            raise InvalidRequest(f"'{key}' must be a {typ.__name__}", param=key)
        kw[key] = typ(v)
    return GroupConfig(name, **kw)


class GroupStore:
    """The groups file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._cache: FileCache[dict[str, GroupConfig]] = filecache.shared(path, "groups")

    def all(self, *, fresh: bool = False) -> dict[str, GroupConfig]:
        """Every group, by name, in file order."""
        return self._cache.get(self._read, fresh=fresh)

    def get(self, name: str) -> GroupConfig | None:
        """The group; a miss checks the file at once (a group just written by the CLI)."""
        found = self.all().get(name)
        if found is None:
            found = self.all(fresh=True).get(name)
        return found

    def _read(self) -> dict[str, GroupConfig]:
        try:
            raw = read_json(self.path, {})
        except ValueError:
            log.error("the groups file is not valid JSON; ignored")
            return {}
        items = raw.get("groups") if isinstance(raw, dict) else None
        if not isinstance(items, dict):
            return {}
        out: dict[str, GroupConfig] = {}
        for name, item in items.items():
            try:
                out[name] = check(from_json(name, item))
            except InvalidRequest as e:
                log.error("the group '%s' in the groups file is invalid and ignored: %s", name, e)
        return out

    def set(
        self,
        cfg: GroupConfig,
        providers: Mapping[str, ProviderConfig],
        taken: Callable[[str], str | None] = lambda _n: None,
    ) -> GroupConfig:
        """Create or replace a group over ``providers`` (by name). ``taken(name)`` names what
        the name would clash with besides a provider prefix (a library id, an alias), or None.

        Raises:
            InvalidRequest: a bad config, a member naming no provider, or a name that clashes.
        """
        cfg = check(cfg)
        for m in cfg.members:
            if not (m in providers if "/" not in m else owner(m, providers)):
                raise InvalidRequest(
                    f"'{m}' is neither a provider's name nor a provider's PREFIX/model",
                    param="members",
                )
        clash = prefix_clash(cfg.name, providers) or taken(cfg.name)
        if clash:
            raise InvalidRequest(f"the group name '{cfg.name}' clashes with {clash}", param="name")
        with file_lock(self.path):
            current = self._read()
            current[cfg.name] = cfg
            self._write(current)
        return cfg

    def remove(self, name: str) -> bool:
        """Forget a group; False when there was none."""
        with file_lock(self.path):
            current = self._read()
            if name not in current:
                return False
            del current[name]
            self._write(current)
        return True

    def _write(self, groups: dict[str, GroupConfig]) -> None:
        body = {n: {k: v for k, v in g.as_json().items() if k != "name"} for n, g in groups.items()}
        atomic_write_json(self.path, {"groups": body})
        self._cache.put(dict(groups))


def member_targets(cfg: GroupConfig, prefixes: Callable[[str], str | None]) -> list[str]:
    """Each member as a target: ``PREFIX/remote`` as it is; a provider NAME (``prefixes(name)``
    its prefix) as ``PREFIX + group name``. A name that is no provider stays as it is."""
    out: list[str] = []
    for m in cfg.members:
        prefix = None if "/" in m else prefixes(m)
        out.append(prefix + cfg.name if prefix is not None else m)
    return out


def owner(target: str, providers: Mapping[str, ProviderConfig]) -> str | None:
    """The provider whose prefix ``target`` starts with (the id after it not empty), or None."""
    for p in providers.values():
        if target.startswith(p.prefix) and len(target) > len(p.prefix):
            return p.name
    return None


def prefix_clash(name: str, providers: Mapping[str, ProviderConfig]) -> str | None:
    """The provider prefix a group name would shadow (it starts with one, or is one without
    its ``/``), or None."""
    for p in providers.values():
        if name.startswith(p.prefix) or name == p.prefix.rstrip("/"):
            return f"the prefix '{p.prefix}' of provider '{p.name}'"
    return None
