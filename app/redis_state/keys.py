"""Named keys several gateways share: the keys.json entries kept in Redis instead.

``hearth:keys`` is a hash, key name -> the JSON a keys.json entry has (the sha256 hash, never
the secret); ``hearth:keys:version`` counts the changes (every add and remove bumps it);
``hearth:keys:used`` holds each key's last use (written in batches, never per request). Each
gateway keeps the last keys it saw and polls the version every ``POLL_S``, so a change made
anywhere is honoured everywhere within a second or so; while Redis is unreachable the last keys
seen stay in force (and changes are refused with 503 ``state_unavailable``).

The first gateway to use an empty shared state imports its local keys.json (once: the version
then exists, so a team whose keys were all removed does not get them back). A Redis that lost
everything (restarted without persistence) gets the last keys its gateways saw put back.
Tested by tests/redis_state/test_keys.py and tests/e2e/shared_state/test_shared_keys.py."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

import redis

from app.core.gateway.keys import (
    ApiKey,
    KeyStore,
    check_limits,
    check_name,
    hash_secret,
    key_from_json,
    key_to_json,
)
from app.errors import AlreadyExists, ConfigError, StateUnavailable
from app.redis_state.connection import SharedState

log = logging.getLogger(__name__)

POLL_S = 0.25  # a change is seen within this (plus one round trip) on every gateway
_FAILURES = (redis.RedisError, OSError)


def _text(v: bytes | str) -> str:
    return v.decode() if isinstance(v, bytes) else v


class SharedKeyStore(KeyStore):
    """A :class:`KeyStore` whose keys live in the shared state. ``local`` is this machine's
    keys.json: imported on first use, and in force until Redis has answered once."""

    def __init__(self, shared: SharedState, local: Path) -> None:
        super().__init__(local)
        self.shared = shared
        self._hash = shared.key("keys")
        self._version_key = shared.key("keys", "version")
        self._used_key = shared.key("keys", "used")
        self._keys: dict[str, ApiKey] | None = None  # the last keys seen (None: none yet)
        self._version: str | None = None
        self._watch: asyncio.Task[None] | None = None

    def all(self, *, fresh: bool = True) -> dict[str, ApiKey]:
        """The last keys seen (no round trip: the poll keeps them fresh)."""
        return super().all(fresh=fresh) if self._keys is None else self._keys

    # -- reading -------------------------------------------------------------------------------
    def load(self) -> dict[str, ApiKey]:
        """Read every key now (blocking: off the loop). Raises StateUnavailable."""
        try:
            self._first_use()
            pipe = self.shared.sync.pipeline(transaction=True)
            pipe.get(self._version_key)
            pipe.hgetall(self._hash)
            pipe.hgetall(self._used_key)
            version, raw, used = pipe.execute()
        except _FAILURES as e:
            raise self._unreachable(e) from e
        self.shared.succeeded()
        return self._apply(version, raw, used)

    async def refresh(self) -> None:
        """Read the keys again when their version changed (one GET when it did not)."""
        if self._keys is None:
            await asyncio.to_thread(self.load)  # the first read may import keys.json
            return
        version = await self.shared.aio.get(self._version_key)
        if version is None:  # Redis lost its data (restarted without persistence, or flushed)
            await asyncio.to_thread(self.load)
            return
        if _text(version) == self._version:
            return
        pipe = self.shared.aio.pipeline(transaction=True)
        pipe.get(self._version_key)
        pipe.hgetall(self._hash)
        pipe.hgetall(self._used_key)
        version, raw, used = await pipe.execute()
        self._apply(version, raw, used)

    def _apply(self, version: Any, raw: dict[Any, Any], used: dict[Any, Any]) -> dict[str, ApiKey]:
        keys: list[ApiKey] = []
        for name, blob in raw.items():
            try:
                key = key_from_json(json.loads(blob))
            except (ValueError, ConfigError) as e:
                # one broken entry refuses that key only; the others keep working
                log.error("shared key %s is invalid (%s); it is not accepted", _text(name), e)
                continue
            last = used.get(name)
            if last is not None:
                seen = max(float(last), key.last_used_at or 0.0)
                key = replace(key, last_used_at=seen)
            keys.append(key)
        keys.sort(key=lambda k: (k.created_at, k.name))  # the order they were added in
        self._keys = {k.name: k for k in keys}
        self._version = None if version is None else _text(version)
        return self._keys

    def _first_use(self) -> None:
        """A shared state with no version yet was never used (this machine's keys.json goes
        in) or lost its data (the last keys this gateway saw go back in). The new version
        starts at Redis's clock in microseconds, so no gateway mistakes it for one it saw."""
        r = self.shared.sync
        if r.exists(self._version_key):
            return
        restoring = self._keys is not None
        source = self._keys if self._keys is not None else super().all()
        keys = {n: k for n, k in source.items() if n}  # "": a broken file's placeholder
        pipe = r.pipeline(transaction=True)
        for name, key in keys.items():
            pipe.hsetnx(self._hash, name, json.dumps(key_to_json(key)))
        sec, usec = r.time()
        pipe.set(self._version_key, sec * 1_000_000 + usec, nx=True)
        pipe.execute()
        if restoring:
            log.warning(
                "the shared state at %s had lost its keys; put back the %d this gateway last saw",
                self.shared.shown,
                len(keys),
            )
        elif keys:
            log.warning(
                "imported %d named keys from %s into the shared state at %s",
                len(keys),
                self.path,
                self.shared.shown,
            )

    # -- changes -------------------------------------------------------------------------------
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
        check_name(name)
        pats = check_limits(rpm, tpm, models)
        key = ApiKey(name, hash_secret(secret), rpm, tpm, pats, admin, time.time())
        try:
            self._first_use()
            added = self.shared.sync.hsetnx(self._hash, name, json.dumps(key_to_json(key)))
            if added:
                self.shared.sync.incr(self._version_key)
        except _FAILURES as e:
            raise self._unreachable(e) from e
        if not added:
            raise AlreadyExists(f"a key named '{name}' exists (remove it first)", param="name")
        self.load()  # this gateway honours it at once; the others at their next poll
        return key

    def remove(self, name: str) -> bool:
        try:
            self._first_use()
            if not self.shared.sync.hdel(self._hash, name):
                return False
            pipe = self.shared.sync.pipeline(transaction=True)
            pipe.incr(self._version_key)
            pipe.hdel(self._used_key, name)
            pipe.execute()
        except _FAILURES as e:
            raise self._unreachable(e) from e
        self.load()
        return True

    def flush_uses(self) -> int:
        """Write the remembered last uses in one HSET; kept for the next flush on failure."""
        with self._used_lock:
            used, self._used = self._used, {}
        if not used:
            return 0
        try:
            self.shared.sync.hset(self._used_key, mapping={n: repr(t) for n, t in used.items()})
        except _FAILURES as e:
            self.shared.failed(e)
            with self._used_lock:
                self._used = used | self._used
            return 0
        return len(used)

    def _unreachable(self, e: BaseException) -> StateUnavailable:
        self.shared.failed(e)
        return StateUnavailable(
            f"the shared keys at {self.shared.shown} cannot be reached now ({self.shared.reason})"
        )

    # -- life ----------------------------------------------------------------------------------
    async def start(self) -> None:
        """Read the keys (a Redis down now is not fatal) and poll their version from now on."""
        if self.shared.usable:
            with contextlib.suppress(StateUnavailable):
                await asyncio.to_thread(self.load)
        if self._watch is None:
            self._watch = asyncio.ensure_future(self._poll())

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(POLL_S)
            if not self.shared.usable:
                continue  # the connection's watch pings until Redis is back
            try:
                await self.refresh()
            except StateUnavailable:
                pass
            except _FAILURES as e:
                self.shared.failed(e)
            except Exception:  # our bug: keep polling, the last keys seen stay in force
                log.exception("could not refresh the shared keys")

    async def close(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
            self._watch = None
