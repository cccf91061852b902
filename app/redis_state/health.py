"""Provider health shared by every gateway: each provider's circuit, cool-down or "unreachable"
mark in the hash ``hearth:health:<provider>`` (``state``, ``until`` in epoch seconds,
``error``, ``failures``), expiring a little after ``until``. Each gateway keeps a local copy,
read again at most every ``REFRESH_S`` per provider, so one gateway's discovery that an
engine is down spares the others the timeout.

Calls are short (one HGETALL or one pipelined write, with SharedState's 0.5 s socket timeout)
and made where the gateway orders a group's members: a Redis that fails degrades the shared
state, and the local copy serves until it answers again.
Tested by tests/redis_state/test_health.py."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping

import redis

from app.core.gateway.groups.health import Health
from app.redis_state.connection import SharedState

log = logging.getLogger(__name__)

REFRESH_S = 0.5  # a provider's record is read from Redis at most this often
LINGER_S = 30  # a record outlives its ``until`` this long (the half-open state reads it)


class RedisHealthBoard:
    """A HealthBoard in Redis with a local copy (see the module doc)."""

    def __init__(self, shared: SharedState, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._shared = shared
        self._clock = clock
        self._local: dict[str, Health | None] = {}
        self._read_at: dict[str, float] = {}

    def _key(self, provider: str) -> str:
        return self._shared.key("health", provider)

    def get(self, provider: str) -> Health | None:
        now = self._clock()
        last = self._read_at.get(provider)
        if self._shared.usable and (last is None or now - last >= REFRESH_S):
            self._read_at[provider] = now
            try:
                raw = self._shared.sync.hgetall(self._key(provider))
            except (redis.RedisError, OSError) as e:
                self._shared.failed(e)
            else:
                self._shared.succeeded()
                self._local[provider] = _parse(raw)
        return self._local.get(provider)

    def put(self, provider: str, health: Health | None) -> None:
        self._local[provider] = health
        self._read_at[provider] = self._clock()
        if not self._shared.usable:
            return
        key = self._key(provider)
        try:
            pipe = self._shared.sync.pipeline(transaction=True)
            pipe.delete(key)
            if health is not None:
                pipe.hset(
                    key,
                    mapping={
                        "state": health.state,
                        "until": repr(health.until),
                        "error": health.error,
                        "failures": str(health.failures),
                    },
                )
                ttl = max(1, math.ceil(health.until - time.time())) + LINGER_S
                pipe.expire(key, ttl)
            pipe.execute()
        except (redis.RedisError, OSError) as e:
            self._shared.failed(e)
        else:
            self._shared.succeeded()


def _parse(raw: Mapping[bytes | str, bytes | str]) -> Health | None:
    if not raw:
        return None
    fields = {
        (k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
        for k, v in raw.items()
    }
    try:
        return Health(
            fields.get("state", ""),
            float(fields.get("until", "0")),
            fields.get("error", ""),
            int(fields.get("failures", "0")),
        )
    except ValueError:
        log.warning("a provider health record in Redis is malformed; ignored")
        return None
