"""Named API keys: ``keys.json`` in the config folder (0600), each key stored only as
the sha256 of its secret, with its limits (rpm, tpm), its model patterns and its role.

Written atomically under a file lock; read through a shared FileCache checked with a stat on
every lookup (``fresh``), so a running server sees ``hearth keys add``/``rm`` at once."""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
import threading
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from app.core.util import filecache
from app.core.util.filecache import FileCache
from app.core.util.fsutil import atomic_write_json, file_lock, read_json, remove_stale_writes
from app.errors import AlreadyExists, ConfigError, InvalidRequest

log = logging.getLogger(__name__)

DEFAULT_NAME = "default"  # the single --api-key / HEARTH_API_KEY key (and settings' keys)
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_HASH = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True, slots=True)
class ApiKey:
    """One key. ``rpm``/``tpm`` 0 = no limit; ``models`` empty = every model."""

    name: str
    hash: str
    rpm: int = 0
    tpm: int = 0
    models: tuple[str, ...] = ()
    admin: bool = False
    created_at: float = 0.0
    last_used_at: float | None = None

    def public(self) -> dict[str, Any]:
        """What ``hearth keys ls --json`` shows: everything but the hash."""
        return {
            "name": self.name,
            "rpm": self.rpm,
            "tpm": self.tpm,
            "models": list(self.models),
            "admin": self.admin,
            "created_at": self.created_at,
            "last_used_at": self.last_used_at,
        }


def hash_secret(secret: str) -> str:
    """sha256 hex, as app.settings.hash_key (the --api-key key's hash)."""
    return hashlib.sha256(secret.encode()).hexdigest()


def cache_partition(secret_hash: str) -> str:
    """The response-cache partition of the key whose secret hashes to ``secret_hash``: a
    digest of the hash, so the cache file holds no key material (a re-issued key starts empty)."""
    return hashlib.sha256(b"hearth-response-cache\0" + secret_hash.encode()).hexdigest()[:32]


def check_name(name: str) -> str:
    if not _NAME.fullmatch(name):
        raise InvalidRequest(
            "a key name is 1-64 letters, digits, '.', '_' or '-' (starting with a letter or digit)",
            param="name",
        )
    if name == DEFAULT_NAME:
        raise InvalidRequest(
            f"'{DEFAULT_NAME}' is the name of the --api-key / HEARTH_API_KEY key", param="name"
        )
    return name


def check_limits(rpm: int, tpm: int, models: Iterable[str]) -> tuple[str, ...]:
    for label, v in (("rpm", rpm), ("tpm", tpm)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise InvalidRequest(f"'{label}' must be a non-negative integer", param=label)
    out = tuple(models)
    for p in out:
        if not p or len(p) > 200 or any(ord(c) < 32 for c in p):
            raise InvalidRequest(f"bad model pattern {p!r}", param="models")
    return out


def key_from_json(raw: Any) -> ApiKey:
    """One keys.json entry (also a shared-state entry) as an ApiKey; ConfigError when broken."""
    if not isinstance(raw, dict):
        raise ConfigError("keys: each key must be an object")
    name, digest = raw.get("name"), raw.get("hash")
    if not isinstance(name, str) or not isinstance(digest, str) or not _HASH.fullmatch(digest):
        raise ConfigError("keys: each key needs a name and a sha256 hash")
    models = raw.get("models") or []
    if not isinstance(models, list) or not all(isinstance(m, str) for m in models):
        raise ConfigError(f"keys: {name}.models must be a list of strings")
    rpm, tpm = raw.get("rpm", 0), raw.get("tpm", 0)
    for v in (rpm, tpm):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ConfigError(f"keys: {name}.rpm and .tpm must be non-negative integers")
    used = raw.get("last_used_at")
    return ApiKey(
        name=name,
        hash=digest,
        rpm=rpm,
        tpm=tpm,
        models=tuple(models),
        admin=raw.get("admin") is True,
        created_at=float(raw.get("created_at") or 0.0),
        last_used_at=float(used) if isinstance(used, int | float) else None,
    )


def key_to_json(key: ApiKey) -> dict[str, Any]:
    """A keys.json entry: the hash, never the secret."""
    return asdict(key) | {"models": list(key.models)}


class KeyStore:
    """The named keys of one ``keys.json``. Thread-safe; every store of one file in this
    process shares its parsed value."""

    def __init__(self, path: Path) -> None:
        self.path = path
        remove_stale_writes(path)
        self._cache: FileCache[dict[str, ApiKey]] = filecache.shared(path, "keys")
        self._used: dict[str, float] = {}  # name -> last use not yet written
        self._used_lock = threading.Lock()

    def all(self, *, fresh: bool = True) -> dict[str, ApiKey]:
        """Every key by name, in file order (a stat of the file first, unless ``fresh=False``)."""
        return self._cache.get(self._read, fresh=fresh)

    def _read(self) -> dict[str, ApiKey]:
        try:
            raw = read_json(self.path, {"keys": []})
            items = raw.get("keys", []) if isinstance(raw, dict) else None
            if not isinstance(items, list):
                raise ConfigError('keys: the file must be {"keys": [...]}')
            keys = [key_from_json(k) for k in items]
        except (ValueError, ConfigError) as e:
            # a broken file must not open the server to everyone: refuse every key instead
            log.error("keys file %s is invalid (%s); no named key is accepted", self.path, e)
            return {"": ApiKey("", "0" * 64)}
        return {k.name: k for k in keys}

    def _write(self, keys: dict[str, ApiKey]) -> None:
        data = {"keys": [key_to_json(k) for k in keys.values()]}
        atomic_write_json(self.path, data, mode=0o600)
        self._cache.put(self._read())

    def add(
        self,
        name: str,
        secret: str,
        *,
        rpm: int = 0,
        tpm: int = 0,
        models: Iterable[str] = (),
        admin: bool = False,
    ) -> ApiKey:
        """Store a new key (its hash only).

        Raises:
            InvalidRequest: a bad name or limit.
            AlreadyExists (an InvalidRequest, 409): a key of that name exists.
        """
        check_name(name)
        pats = check_limits(rpm, tpm, models)
        with file_lock(self.path):
            keys = dict(self._read())
            if name in keys:
                raise AlreadyExists(f"a key named '{name}' exists (remove it first)", param="name")
            key = ApiKey(name, hash_secret(secret), rpm, tpm, pats, admin, time.time())
            keys[name] = key
            self._write(keys)
        return key

    def remove(self, name: str) -> bool:
        with file_lock(self.path):
            keys = dict(self._read())
            if keys.pop(name, None) is None:
                return False
            self._write(keys)
        return True

    def match(self, digest: str) -> ApiKey | None:
        """The key whose hash is ``digest`` (compared with every key, in constant time each)."""
        found: ApiKey | None = None
        for k in self.all().values():
            if hmac.compare_digest(digest, k.hash) and found is None:
                found = k
        return found

    # -- last use: remembered in memory, written in batches (never a disk write per request)
    def note_use(self, name: str, when: float | None = None) -> None:
        with self._used_lock:
            self._used[name] = time.time() if when is None else when

    def flush_uses(self) -> int:
        """Write the remembered uses into the file; returns how many keys it updated."""
        with self._used_lock:
            used, self._used = self._used, {}
        if not used:
            return 0
        with file_lock(self.path):
            keys = dict(self._read())
            hit = {n: t for n, t in used.items() if n in keys}
            for n, t in hit.items():
                keys[n] = replace(keys[n], last_used_at=max(t, keys[n].last_used_at or 0.0))
            if hit:
                self._write(keys)
        return len(hit)
