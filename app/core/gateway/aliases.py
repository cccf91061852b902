"""Aliases: a name standing for one target or an ordered fallback chain, in ``aliases.json`` in
the config folder (atomic writes under a file lock; read through a shared FileCache, so a
running server sees a change made by the CLI within a second).
Tested by tests/core/gateway/test_gateway.py and tests/server/edge/test_image_targets.py."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from app.core.gateway.auto import AUTO
from app.core.util import filecache
from app.core.util.filecache import FileCache
from app.core.util.fsutil import atomic_write_json, file_lock, read_json
from app.errors import InvalidRequest

log = logging.getLogger(__name__)

# printable, no whitespace or control characters; ':' allowed (Ollama-style tags), '/' too
# (names such as "openai/gpt-4o-mini" that tools hard-code)
_NAME = re.compile(r"[^\s\x00-\x1f\x7f]{1,200}")
MAX_TARGETS = 16

Aliases = dict[str, tuple[str, ...]]


class AliasCycle(InvalidRequest):
    code = "alias_cycle"


class AliasStore:
    """The aliases file. ``is_model(id)`` says whether an id is a target other than an alias
    (a library id now; a remote ``PREFIX/id`` later)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._cache: FileCache[Aliases] = filecache.shared(path, "aliases")

    def all(self, *, fresh: bool = False) -> Aliases:
        """Every alias; ``fresh`` checks the file now (one stat) rather than within a second."""
        return self._cache.get(self._read, fresh=fresh)

    def get(self, name: str) -> tuple[str, ...] | None:
        """The alias's targets. A miss checks the file at once (one stat), so an alias another
        process (``hearth alias set``) just wrote is found by the very next request."""
        found = self.all().get(name)
        if found is None:
            found = self.all(fresh=True).get(name)
        return found

    def _read(self) -> Aliases:
        try:
            raw = read_json(self.path, {})
        except ValueError:
            return {}
        return _parse(raw)

    def set(
        self, name: str, targets: Sequence[str], is_model: Callable[[str], bool]
    ) -> tuple[str, ...]:
        """Create or replace an alias.

        Raises:
            InvalidRequest: a bad name, a name that is a model id or ``auto``, an unknown
                target, or a cycle (AliasCycle, naming it).
        """
        check_name(name)
        if is_model(name):
            raise InvalidRequest(f"'{name}' is a model id; an alias may not shadow a model")
        if not targets:
            raise InvalidRequest("an alias needs at least one target")
        if len(targets) > MAX_TARGETS:
            raise InvalidRequest(f"an alias has at most {MAX_TARGETS} targets")
        if len(set(targets)) != len(targets):
            raise InvalidRequest("an alias lists each target once")
        with file_lock(self.path):
            current = self._read()
            for t in targets:
                if t == AUTO:
                    raise InvalidRequest("'auto' cannot be an alias target")
                if not is_model(t) and t not in current and t != name:
                    raise InvalidRequest(f"'{t}' is neither a model id nor an alias")
            updated = {**current, name: tuple(targets)}
            cycle = find_cycle(name, updated)
            if cycle:
                raise AliasCycle(f"alias cycle: {' -> '.join(cycle)}")
            self._write(updated)
        return tuple(targets)

    def remove(self, name: str) -> bool:
        """Forget an alias; False when there was none. Aliases pointing at it stay (they then
        answer 404 for that target) and are named by :meth:`users_of`."""
        with file_lock(self.path):
            current = self._read()
            if name not in current:
                return False
            del current[name]
            self._write(current)
        return True

    def users_of(self, name: str) -> list[str]:
        return sorted(a for a, ts in self.all().items() if name in ts)

    def _write(self, aliases: Aliases) -> None:
        atomic_write_json(self.path, {"aliases": {k: list(v) for k, v in sorted(aliases.items())}})
        self._cache.put(dict(aliases))


def check_name(name: str) -> None:
    if name == AUTO:
        raise InvalidRequest("'auto' is reserved (the model picked by routing rules)")
    if not _NAME.fullmatch(name):
        raise InvalidRequest(
            f"'{name}' is not a valid alias (1-200 characters, no spaces or control characters)"
        )


def find_cycle(start: str, aliases: Mapping[str, Sequence[str]]) -> list[str] | None:
    """The first cycle reachable from ``start`` (``[a, b, a]``), or None."""
    path: list[str] = []
    done: set[str] = set()

    def walk(name: str) -> list[str] | None:
        if name in path:
            return [*path[path.index(name) :], name]
        if name in done or name not in aliases:
            return None
        path.append(name)
        for t in aliases[name]:
            found = walk(t)
            if found:
                return found
        path.pop()
        done.add(name)
        return None

    return walk(start)


def _parse(raw: Any) -> Aliases:
    data = raw.get("aliases") if isinstance(raw, dict) else None
    if not isinstance(data, dict):
        if raw not in ({}, None):
            log.error('the aliases file is not {"aliases": {NAME: [TARGET, ...]}}; ignored')
        return {}
    out: Aliases = {}
    for k, v in data.items():
        if isinstance(k, str) and isinstance(v, list) and v and all(isinstance(t, str) for t in v):
            out[k] = tuple(v)
    return out
