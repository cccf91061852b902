"""Stored Responses in the shared Redis, so a conversation continued by
``previous_response_id`` finds its earlier turn whichever gateway the load balancer picks.

The same interface and bounds as the SQLite :class:`~app.core.gateway.response_store.
ResponseStore` (which stays the store while Redis cannot be reached, and without shared state):
one key per response, ``hearth:resp:<partition>/<id>``, expiring after ``responses.max_age_days``
(Redis keeps the age); an index of every entry by the time it was kept and its size, so that past
``responses.max_bytes`` the oldest go first. Keeping one and evicting is one Lua script, atomic
across gateways. Calls are short, on the service loop, with the shared state's short timeouts; a
failed call marks the state degraded and falls back to the local store.
Tested by tests/redis_state/test_responses.py."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

import redis

from app.core.gateway.response_store import (
    DAY_S,
    ResponseStore,
    ResponseStoreConfig,
    StoredResponse,
)
from app.redis_state.connection import SharedState

log = logging.getLogger(__name__)

# KEYS: entry, index (zset: member -> time kept), sizes (hash: member -> bytes), total (bytes)
# ARGV: member, payload, ttl ms, max bytes, size, entry-key prefix
_PUT = """
local now = redis.call('TIME')
local t = tonumber(now[1]) + tonumber(now[2]) / 1e6
local old = redis.call('HGET', KEYS[3], ARGV[1])
if old then redis.call('DECRBY', KEYS[4], old) end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
redis.call('ZADD', KEYS[2], t, ARGV[1])
redis.call('HSET', KEYS[3], ARGV[1], ARGV[5])
local total = redis.call('INCRBY', KEYS[4], ARGV[5])
local function drop(member)
  local size = redis.call('HGET', KEYS[3], member)
  if size then total = redis.call('DECRBY', KEYS[4], size) end
  redis.call('HDEL', KEYS[3], member)
  redis.call('ZREM', KEYS[2], member)
  redis.call('DEL', ARGV[6] .. member)
end
for _, member in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', t - tonumber(ARGV[3]) / 1000)) do
  drop(member)
end
while total > tonumber(ARGV[4]) do
  local oldest = redis.call('ZRANGE', KEYS[2], 0, 0)
  if #oldest == 0 then break end
  drop(oldest[1])
end
return total
"""

# KEYS: entry, index, sizes, total; ARGV: member. Whether the entry was there.
_DELETE = """
local size = redis.call('HGET', KEYS[3], ARGV[1])
if size then redis.call('DECRBY', KEYS[4], size) end
redis.call('HDEL', KEYS[3], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
return redis.call('DEL', KEYS[1])
"""


class SharedResponseStore:
    """:class:`ResponseStorage` kept in Redis (see the module doc); ``local`` serves while the
    shared state is degraded. Entries written locally meanwhile stay local."""

    def __init__(
        self,
        shared: SharedState,
        local: ResponseStore,
        config: Callable[[], ResponseStoreConfig] = ResponseStoreConfig,
    ) -> None:
        self.shared = shared
        self.local = local
        self._config = config
        self._put = shared.sync.register_script(_PUT)
        self._delete = shared.sync.register_script(_DELETE)
        self._prefix = shared.key("resp", "")
        self._keys = [shared.key("resp-index"), shared.key("resp-sizes"), shared.key("resp-bytes")]

    def _member(self, partition: str, response_id: str) -> str:
        return f"{partition}/{response_id}"

    def put(self, partition: str, entry: StoredResponse) -> None:
        if not self.shared.usable:
            self.local.put(partition, entry)
            return
        payload = json.dumps(
            {"response": entry.response, "input": entry.input}, separators=(",", ":")
        )
        size = len(payload.encode())
        cfg = self._config()
        if size > cfg.max_bytes:
            log.warning(
                "response %s (%d bytes) is over responses.max_bytes; not kept", entry.id, size
            )
            return
        member = self._member(partition, entry.id)
        ttl_ms = max(1, int(cfg.max_age_days * DAY_S * 1000))
        try:
            self._put(
                keys=[self._prefix + member, *self._keys],
                args=[member, payload, ttl_ms, cfg.max_bytes, size, self._prefix],
            )
        except (redis.RedisError, OSError) as e:
            self.shared.failed(e)
            self.local.put(partition, entry)
            return
        self.shared.succeeded()

    def get(self, partition: str, response_id: str) -> StoredResponse | None:
        if not self.shared.usable:
            return self.local.get(partition, response_id)
        try:
            raw: Any = self.shared.sync.get(self._prefix + self._member(partition, response_id))
        except (redis.RedisError, OSError) as e:
            self.shared.failed(e)
            return self.local.get(partition, response_id)
        self.shared.succeeded()
        if raw is None:  # kept locally while Redis was away, perhaps
            return self.local.get(partition, response_id)
        data = json.loads(raw)
        return StoredResponse(response_id, data["response"], data["input"])

    def delete(self, partition: str, response_id: str) -> bool:
        gone = self.local.delete(partition, response_id)
        if not self.shared.usable:
            return gone
        member = self._member(partition, response_id)
        try:
            n = self._delete(keys=[self._prefix + member, *self._keys], args=[member])
        except (redis.RedisError, OSError) as e:
            self.shared.failed(e)
            return gone
        self.shared.succeeded()
        return bool(n) or gone

    def close(self) -> None:
        self.local.close()
