"""The response cache kept in Redis: an answer cached through one gateway is a hit through every
gateway that shares the Redis. The same interface as the SQLite store
(:class:`~app.core.gateway.cache.store.AnswerStore`) and the same codec; the replay layer does
not know which it has.

Keys, all under ``hearth:cache:`` (``clear`` removes those and nothing else):

- ``e:<key>``: an answer (``store.encode``), its TTL kept by Redis (``SET ... PX``).
- ``used``: a sorted set of entry keys by last use; a put trims it to ``max_entries`` (least
  recently used first) and drops members whose entry expired (lazily: also when a get misses).
- ``stats``: the hit / semantic hit / miss / bypass counters (``HINCRBY``).
- ``s:<skey>`` and ``v:<skey>``: semantic mode's candidates for one semantic key (the model,
  the caller's partition, everything but the last user message): a sorted set of the
  ``SEMANTIC_CANDIDATES`` most recent entry keys and a hash of their vectors (float32, as
  ``store.pack_vector``). A lookup fetches that hash in one round trip and compares in Python
  (numpy): O(candidates) per lookup, never O(all entries). The oldest candidates fall out of the
  set as new ones come in; an expired or trimmed one is dropped when a lookup picks it.

Several gateways write at once: a put and a hit's bookkeeping are each one Lua script (atomic,
one round trip), so a trim never leaves an entry without its index member or the reverse. The
scripts name entry keys they compute, so this needs one Redis (or Valkey) server, not a cluster.

While the shared state is degraded (``SharedState.usable`` false) every call goes to the local
SQLite store instead. A Redis error during a lookup is a miss (the state is marked failed);
during a put or a count the write is dropped with a log line: the cache never fails a request.
Tested by tests/redis_state/test_cache.py and tests/e2e/test_shared_cache_serve.py."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np
import redis

from app.core.gateway.cache.store import (
    COUNTERS,
    AnswerStore,
    CachedAnswer,
    decode,
    encode,
    pack_vector,
)
from app.redis_state.connection import SharedState

log = logging.getLogger(__name__)

SEMANTIC_CANDIDATES = 256  # vectors kept per semantic key: a lookup reads at most this many
PICKS = 4  # candidates over the threshold tried in turn when the best one has just expired
_CHUNK = 1000  # members per pipeline when stats walks the index
ERRORS = (redis.RedisError, OSError)

# KEYS: entry, index, stats[, candidates, vectors]; ARGV: now, key, counter
_GET = """
local v = redis.call('GET', KEYS[1])
if v then
  redis.call('ZADD', KEYS[2], ARGV[1], ARGV[2])
  redis.call('HINCRBY', KEYS[3], ARGV[3], 1)
else
  redis.call('ZREM', KEYS[2], ARGV[2])
  if KEYS[4] then
    redis.call('ZREM', KEYS[4], ARGV[2])
    redis.call('HDEL', KEYS[5], ARGV[2])
  end
end
return v
"""

# KEYS: entry, index, candidates, vectors
# ARGV: payload, ttl_ms, now, key, max_entries, expired_before, entry prefix, vector ('' none),
#       candidates bound
_PUT = """
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[4])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', ARGV[6])
local over = redis.call('ZCARD', KEYS[2]) - tonumber(ARGV[5])
if over > 0 then
  local gone = redis.call('ZPOPMIN', KEYS[2], over)
  for i = 1, #gone, 2 do redis.call('DEL', ARGV[7] .. gone[i]) end
end
if ARGV[8] ~= '' then
  redis.call('ZADD', KEYS[3], ARGV[3], ARGV[4])
  redis.call('HSET', KEYS[4], ARGV[4], ARGV[8])
  local extra = redis.call('ZCARD', KEYS[3]) - tonumber(ARGV[9])
  if extra > 0 then
    local old = redis.call('ZPOPMIN', KEYS[3], extra)
    for i = 1, #old, 2 do redis.call('HDEL', KEYS[4], old[i]) end
  end
  redis.call('PEXPIRE', KEYS[3], ARGV[2])
  redis.call('PEXPIRE', KEYS[4], ARGV[2])
end
return 0
"""


def best_matches(
    vector: Sequence[float], blobs: dict[bytes, bytes], threshold: float
) -> list[tuple[str, float]]:
    """``(key, cosine)`` of the candidates at least ``threshold`` close to ``vector``, best
    first (candidates of another dimension, or zero vectors, never match)."""
    query = np.asarray(vector, dtype=np.float32)
    qnorm = float(np.linalg.norm(query))
    width = query.size * 4
    keys = [k for k, b in blobs.items() if len(b) == width]
    if not keys or not qnorm:
        return []
    mat = np.frombuffer(b"".join(blobs[k] for k in keys), dtype="<f4").reshape(len(keys), -1)
    norms = np.linalg.norm(mat, axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        scores = (mat @ query) / (norms * qnorm)
    order = np.argsort(-scores)
    return [
        (keys[i].decode(), float(scores[i]))
        for i in order
        if norms[i] and float(scores[i]) >= threshold
    ]


class RedisCacheStore:
    """The response cache's entries and counters in the shared Redis (see the module doc), with
    ``local`` (this machine's SQLite store, or None: nothing) while Redis cannot be used."""

    def __init__(self, shared: SharedState, local: AnswerStore | None = None) -> None:
        self.shared = shared
        self.local = local
        self._r: redis.Redis = shared.sync
        self._get = self._r.register_script(_GET)
        self._put = self._r.register_script(_PUT)
        self.prefix = shared.key("cache", "")  # hearth:cache:

    # -- names ---------------------------------------------------------------------------------
    def _entry(self, key: str) -> str:
        return self.prefix + "e:" + key

    @property
    def _index(self) -> str:
        return self.prefix + "used"

    @property
    def _stats(self) -> str:
        return self.prefix + "stats"

    def _semantic(self, skey: str) -> tuple[str, str]:
        return self.prefix + "s:" + skey, self.prefix + "v:" + skey

    # -- the AnswerStore interface -------------------------------------------------------------
    def get(self, key: str, now: float, ttl_s: float) -> CachedAnswer | None:
        """The entry under ``key`` (Redis keeps the TTL; counted a hit, its use noted)."""
        if not self.shared.usable:
            return self.local.get(key, now, ttl_s) if self.local else None
        try:
            raw = self._get(
                keys=[self._entry(key), self._index, self._stats], args=[now, key, "hits"]
            )
        except ERRORS as e:  # a miss, never an error: the request goes on without the cache
            self.shared.failed(e)
            return None
        return decode(raw) if raw is not None else None

    def nearest(
        self, skey: str, vector: Sequence[float], threshold: float, now: float, ttl_s: float
    ) -> tuple[CachedAnswer, float] | None:
        """The closest live candidate under ``skey`` if its cosine is at least ``threshold``
        (counted a semantic hit). Reads at most ``SEMANTIC_CANDIDATES`` vectors."""
        if not self.shared.usable:
            if self.local is None:
                return None
            return self.local.nearest(skey, vector, threshold, now, ttl_s)
        cands, vecs = self._semantic(skey)
        try:
            blobs: dict[bytes, bytes] = self._r.hgetall(vecs)  # type: ignore[assignment]
            for key, score in best_matches(vector, blobs, threshold)[:PICKS]:
                raw = self._get(
                    keys=[self._entry(key), self._index, self._stats, cands, vecs],
                    args=[now, key, "semantic_hits"],
                )
                if raw is not None:
                    return decode(raw), score
        except ERRORS as e:
            self.shared.failed(e)
        return None

    def put(
        self,
        key: str,
        answer: CachedAnswer,
        now: float,
        *,
        max_entries: int,
        ttl_s: float,
        skey: str | None = None,
        vector: Sequence[float] | None = None,
    ) -> None:
        """Store (or replace) an entry for ``ttl_s``, then trim to ``max_entries`` by last use
        (and the semantic key's candidates to ``SEMANTIC_CANDIDATES``)."""
        if not self.shared.usable:
            if self.local is not None:
                self.local.put(
                    key,
                    answer,
                    now,
                    max_entries=max_entries,
                    ttl_s=ttl_s,
                    skey=skey,
                    vector=vector,
                )
            return
        cands, vecs = self._semantic(skey or "")
        blob = pack_vector(vector) if vector and skey else b""
        try:
            self._put(
                keys=[self._entry(key), self._index, cands, vecs],
                args=[
                    encode(answer),
                    max(1, round(ttl_s * 1000)),
                    now,
                    key,
                    max(1, max_entries),
                    now - ttl_s,
                    self.prefix + "e:",
                    blob,
                    SEMANTIC_CANDIDATES,
                ],
            )
        except ERRORS as e:  # the answer went out already: only the cached copy is lost
            self.shared.failed(e)
            log.warning("response cache: an answer was not stored in the shared state: %s", e)

    def count(self, counter: str) -> None:
        if not self.shared.usable:
            if self.local is not None:
                self.local.count(counter)
            return
        try:
            self._r.hincrby(self._stats, counter, 1)
        except ERRORS as e:
            self.shared.failed(e)

    def clear(self) -> int:
        """Remove every cached answer and reset the counters, in Redis (only ``hearth:cache:``
        keys) and in the local fallback. Returns the answers removed."""
        n = self.local.clear() if self.local is not None else 0
        if not self.shared.usable:
            return n
        try:
            batch: list[bytes] = []
            entry = (self.prefix + "e:").encode()
            for name in self._r.scan_iter(match=_glob(self.prefix) + "*", count=_CHUNK):
                batch.append(name)
                n += name.startswith(entry)
                if len(batch) >= _CHUNK:
                    self._r.unlink(*batch)
                    batch.clear()
            if batch:
                self._r.unlink(*batch)
        except ERRORS as e:
            self.shared.failed(e)
            raise
        return n

    def stats(self) -> dict[str, int]:
        """``entries`` (live), ``bytes`` (the stored answers' size) and each counter. Walks the
        index (at most ``max_entries`` members), dropping members whose entry expired."""
        if not self.shared.usable:
            return self.local.stats() if self.local is not None else _empty()
        try:
            members: list[bytes] = self._r.zrange(self._index, 0, -1)  # type: ignore[assignment]
            entries = size = 0
            for start in range(0, len(members), _CHUNK):
                chunk = members[start : start + _CHUNK]
                pipe = self._r.pipeline(transaction=False)
                for m in chunk:
                    pipe.strlen(self._entry(m.decode()))
                lengths = pipe.execute()
                dead = [m for m, n in zip(chunk, lengths, strict=True) if not n]
                if dead:
                    self._r.zrem(self._index, *dead)
                entries += len(chunk) - len(dead)
                size += sum(lengths)
            counters: dict[bytes, bytes] = self._r.hgetall(self._stats)  # type: ignore[assignment]
        except ERRORS as e:
            self.shared.failed(e)
            raise
        named = {k.decode(): int(v) for k, v in counters.items()}
        return {"entries": entries, "bytes": size} | {c: named.get(c, 0) for c in COUNTERS}

    def close(self) -> None:
        """Closes the local fallback; the Redis clients belong to the shared state."""
        if self.local is not None:
            self.local.close()


def _empty() -> dict[str, int]:
    return {"entries": 0, "bytes": 0} | dict.fromkeys(COUNTERS, 0)


def _glob(text: str) -> str:
    """``text`` matched literally in a SCAN pattern."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)
