"""Providers: remote engines Hearth routes to, in ``providers.json`` in the config
folder, their API keys apart in ``provider_keys.json`` (0600), never in settings.json.

Both files are written atomically under a file lock and read through shared FileCaches, so a
running server sees ``hearth providers add``/``rm`` from another process within a second (a
miss checks at once)."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from app.core.gateway.auto import AUTO
from app.core.util import filecache
from app.core.util.filecache import FileCache
from app.core.util.fsutil import atomic_write_json, file_lock, read_json
from app.errors import InvalidRequest

log = logging.getLogger(__name__)

KINDS = ("openai", "vllm", "sglang", "llama.cpp", "ollama", "hearth", "tgi")
_NAME = re.compile(r"[a-z0-9-]{1,64}")
_PREFIX = re.compile(r"[^\s\x00-\x1f\x7f]{1,100}/")
DEFAULT_CONNECT_TIMEOUT = 10.0
DEFAULT_FIRST_TOKEN_TIMEOUT = 120.0
DEFAULT_IDLE_TIMEOUT = 60.0


@dataclass(frozen=True, slots=True)
class ProviderConfig:
    """One remote engine. ``url`` is its OpenAI base URL (``http://10.0.0.5:8000/v1``); its
    models are ``prefix + remote id``. Timeouts in seconds: to connect, from the request to
    the first token, and between two chunks of a stream. ``follow_redirects``: a 3xx from the
    engine is followed (off: it answers 502, so a prompt is never re-posted somewhere else)."""

    name: str
    url: str
    kind: str = "openai"
    prefix: str = ""
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    first_token_timeout: float = DEFAULT_FIRST_TOKEN_TIMEOUT
    idle_timeout: float = DEFAULT_IDLE_TIMEOUT
    follow_redirects: bool = False

    def __post_init__(self) -> None:
        if not self.prefix:
            object.__setattr__(self, "prefix", f"{self.name}/")

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def check(cfg: ProviderConfig) -> ProviderConfig:
    """The config, validated and normalised (the URL without a trailing ``/``).

    Raises:
        InvalidRequest: a bad name, kind, URL, prefix or timeout.
    """
    if cfg.name == AUTO or not _NAME.fullmatch(cfg.name):
        raise InvalidRequest(
            f"'{cfg.name}' is not a valid provider name ([a-z0-9-]+, and not 'auto')"
        )
    if cfg.kind not in KINDS:
        raise InvalidRequest(f"unknown kind '{cfg.kind}' (one of {', '.join(KINDS)})")
    url = cfg.url.strip().rstrip("/")
    if not re.fullmatch(r"https?://[^\s/?#]+(/[^\s?#]*)?", url):
        raise InvalidRequest(f"'{cfg.url}' is not an http(s) URL")
    if "@" in url.split("/", 3)[2]:  # user:password@host would show in every listing and log
        raise InvalidRequest("put credentials in --api-key, not in the URL (user:password@...)")
    if not _PREFIX.fullmatch(cfg.prefix) or cfg.prefix.count("/") != 1:
        raise InvalidRequest(
            f"'{cfg.prefix}' is not a valid prefix (no spaces, one '/', at the end: 'lan/')"
        )
    if cfg.prefix.rstrip("/") == AUTO:
        raise InvalidRequest("the prefix 'auto/' is reserved")
    for label, v in (
        ("connect", cfg.connect_timeout),
        ("first-token", cfg.first_token_timeout),
        ("idle", cfg.idle_timeout),
    ):
        if not 0 < v <= 86_400:
            raise InvalidRequest(f"the {label} timeout must be in (0, 86400] seconds")
    return replace(cfg, url=url)


class ProviderStore:
    """The providers file and its keys file."""

    def __init__(self, path: Path, keys_path: Path) -> None:
        self.path = path
        self.keys_path = keys_path
        self._cache: FileCache[dict[str, ProviderConfig]] = filecache.shared(path, "providers")
        self._keys: FileCache[dict[str, str]] = filecache.shared(keys_path, "provider-keys")

    # -- reading ------------------------------------------------------------------------------
    def all(self, *, fresh: bool = False) -> dict[str, ProviderConfig]:
        """Every provider, by name, in the order they were added."""
        return self._cache.get(self._read, fresh=fresh)

    def get(self, name: str) -> ProviderConfig | None:
        found = self.all().get(name)
        if found is None:
            found = self.all(fresh=True).get(name)
        return found

    def key(self, name: str) -> str | None:
        """The provider's API key (never logged, never listed)."""
        return self._keys.get(self._read_keys).get(name)

    def signature(self) -> tuple[Any, ...]:
        """What changes when either file changes (the pool rebuilds its clients then)."""
        # the cached parses themselves: while neither file changed they are the same objects,
        # and the pool asks this several times a request (equal contents compare equal too)
        configs = self.all()
        return (configs, tuple(configs), self._keys.get(self._read_keys))

    def _read(self) -> dict[str, ProviderConfig]:
        try:
            raw = read_json(self.path, {})
        except ValueError:
            log.error("the providers file is not valid JSON; ignored")
            return {}
        items = raw.get("providers") if isinstance(raw, dict) else None
        if not isinstance(items, list):
            return {}
        out: dict[str, ProviderConfig] = {}
        for item in items:
            try:
                cfg = check(_from_json(item))
            except (InvalidRequest, TypeError, ValueError) as e:
                log.error("a provider in the providers file is invalid and ignored: %s", e)
                continue
            out[cfg.name] = cfg
        return out

    def _read_keys(self) -> dict[str, str]:
        try:
            raw = read_json(self.keys_path, {})
        except ValueError:
            return {}
        keys = raw.get("keys") if isinstance(raw, dict) else None
        if not isinstance(keys, dict):
            return {}
        return {k: v for k, v in keys.items() if isinstance(k, str) and isinstance(v, str)}

    # -- writing ------------------------------------------------------------------------------
    def add(
        self,
        cfg: ProviderConfig,
        api_key: str | None,
        taken: Callable[[str], str | None],
    ) -> ProviderConfig:
        """Add (or replace, by name) a provider. ``taken(prefix)`` names what a prefix would
        clash with (a library id or alias starting with it), or None.

        Raises:
            InvalidRequest: an invalid config, or a prefix that clashes with a library id, an
                alias or another provider's prefix.
        """
        cfg = check(cfg)
        clash = taken(cfg.prefix)
        if clash:
            raise InvalidRequest(f"the prefix '{cfg.prefix}' clashes with {clash}")
        with file_lock(self.path):
            current = self._read()
            for other in current.values():
                if other.name != cfg.name and other.prefix == cfg.prefix:
                    raise InvalidRequest(
                        f"the prefix '{cfg.prefix}' clashes with provider '{other.name}' "
                        f"(prefix '{other.prefix}')"
                    )
            current[cfg.name] = cfg
            self._write(current.values())
            keys = self._read_keys()
            if api_key:
                keys[cfg.name] = api_key
            else:
                keys.pop(cfg.name, None)
            self._write_keys(keys)
        return cfg

    def remove(self, name: str) -> bool:
        with file_lock(self.path):
            current = self._read()
            if name not in current:
                return False
            del current[name]
            self._write(current.values())
            keys = self._read_keys()
            if keys.pop(name, None) is not None:
                self._write_keys(keys)
        return True

    def _write(self, cfgs: Iterable[ProviderConfig]) -> None:
        items = list(cfgs)
        atomic_write_json(self.path, {"providers": [c.as_json() for c in items]})
        self._cache.put({c.name: c for c in items})

    def _write_keys(self, keys: dict[str, str]) -> None:
        atomic_write_json(self.keys_path, {"keys": keys}, mode=0o600)
        self._keys.put(dict(keys))


def _from_json(item: Any) -> ProviderConfig:
    if not isinstance(item, dict):
        raise TypeError("a provider is an object")
    fields = {k: item[k] for k in ProviderConfig.__dataclass_fields__ if k in item}
    for k in ("connect_timeout", "first_token_timeout", "idle_timeout"):
        if k in fields:
            fields[k] = float(fields[k])
    if "follow_redirects" in fields:
        fields["follow_redirects"] = fields["follow_redirects"] is True
    return ProviderConfig(**fields)
