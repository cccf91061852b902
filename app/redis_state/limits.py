"""Rate-limit buckets several gateways share: app/core/gateway/ratelimit.py's token buckets,
kept in Redis and charged by one server-side script per admission.

Each tier (a key's, ``hearth:rl:key:NAME``, or the server-wide one, ``hearth:rl:global``) is a
hash holding each bucket's limit, level and when it was written (``rpm``/``rl``/``ra`` for
requests, ``tpm``/``tl``/``ta`` for tokens). The admission script refills every bucket by
Redis's own clock (``TIME``: gateways with skewed clocks agree), refuses without charging when
any must wait, and charges all of them otherwise; the settle script charges (or refunds) the
tokens a request really used against what admission charged. A written bucket expires once it
would be full again (a missing one is full), so idle keys leave nothing behind.

Scripts run by EVALSHA, loaded again on NOSCRIPT (redis-py's ``register_script``). A failing
call marks the shared state degraded and answers None: the caller uses its in-process buckets.
Tested by tests/redis_state/test_limits.py and tests/e2e/shared_state/test_shared_limits.py."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import redis

from app.core.gateway.ratelimit import BURST_S, Tier, Verdict, bucket_headers
from app.redis_state.connection import SharedState

log = logging.getLogger(__name__)

# the bucket math, once for both scripts: ARGV[1] is BURST_S
_BUCKET = """
local BURST = tonumber(ARGV[1])
local function now_s()
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end
-- a bucket's level at ``now`` (refilled at pm/60 a second, at most its capacity) and its
-- capacity; a bucket never written, or written under another limit, is full
local function level(key, kind, pm, now)
  local cap = math.max(1, pm * BURST / 60)
  local v = redis.call('HMGET', key, kind .. 'pm', kind .. 'l', kind .. 'a')
  if tonumber(v[1]) ~= pm or not v[2] or not v[3] then return cap, cap end
  return math.min(cap, tonumber(v[2]) + (now - tonumber(v[3])) * pm / 60), cap
end
-- write a bucket's level; returns the milliseconds until it is full again
local function store(key, kind, pm, lv, cap, now)
  redis.call('HSET', key, kind .. 'pm', pm, kind .. 'l', string.format('%.17g', lv),
    kind .. 'a', string.format('%.17g', now))
  return math.ceil((cap - lv) / (pm / 60) * 1000)
end
local function expire(key, ms)
  redis.call('PEXPIRE', key, math.max(ms, 0) + 1000)
end
"""

# KEYS: the tiers' hashes. ARGV: BURST_S, tokens, requests, then each tier's rpm and tpm.
# Answers {wait, limit, the first tier's requests level, its tokens level} as strings ("" for
# a bucket it has not).
ADMIT = (
    _BUCKET
    + """
local now = now_s()
local tokens, requests = tonumber(ARGV[2]), tonumber(ARGV[3])
local worst, which = 0, ''
local tiers = {}
for i, key in ipairs(KEYS) do
  local rpm, tpm = tonumber(ARGV[2 + 2 * i]), tonumber(ARGV[3 + 2 * i])
  local buckets = {}
  if rpm > 0 then buckets[#buckets + 1] = {'r', rpm, requests, 'requests'} end
  if tpm > 0 then buckets[#buckets + 1] = {'t', tpm, tokens, 'tokens'} end
  for _, b in ipairs(buckets) do
    local lv, cap = level(key, b[1], b[2], now)
    b[5], b[6] = lv, cap
    if b[3] > 0 or b[1] == 't' then  -- a tier in token debt refuses even 0 tokens
      local need = math.min(b[3], cap) - lv
      if need > 1e-9 then  -- float dust at the boundary is no wait
        local wait = need / (b[2] / 60)
        if wait > worst then worst, which = wait, b[4] end
      end
    end
  end
  tiers[i] = buckets
end
if worst <= 0 then
  for i, key in ipairs(KEYS) do
    local longest = 0
    for _, b in ipairs(tiers[i]) do
      if b[3] > 0 then b[5] = b[5] - b[3] end
      longest = math.max(longest, store(key, b[1], b[2], b[5], b[6], now))
    end
    expire(key, longest)
  end
end
local shown = {r = '', t = ''}
for _, b in ipairs(tiers[1] or {}) do shown[b[1]] = string.format('%.17g', b[5]) end
return {string.format('%.17g', worst), which, shown.r, shown.t}
"""
)

# KEYS: the tiers' hashes. ARGV: BURST_S, the tokens used minus those charged, each tier's tpm.
SETTLE = (
    _BUCKET
    + """
local now = now_s()
local delta = tonumber(ARGV[2])
for i, key in ipairs(KEYS) do
  local tpm = tonumber(ARGV[2 + i])
  if tpm > 0 then
    local lv, cap = level(key, 't', tpm, now)
    if delta > 0 then lv = lv - delta else lv = math.min(cap, lv - delta) end
    expire(key, store(key, 't', tpm, lv, cap, now))
  end
end
return 1
"""
)


class RedisBuckets:
    """The shared buckets (a ``ratelimit.SharedBuckets``) of one :class:`SharedState`."""

    def __init__(self, shared: SharedState) -> None:
        self.shared = shared
        self._admit = shared.aio.register_script(ADMIT)
        self._settle = shared.aio.register_script(SETTLE)

    @property
    def usable(self) -> bool:
        return self.shared.usable

    def _key(self, tier: Tier) -> str:
        return self.shared.key("rl", tier.name or "global")

    async def admit(
        self, tiers: Sequence[Tier], tokens: float, requests: float = 1.0
    ) -> Verdict | None:
        """:func:`ratelimit.admit` over the shared buckets; None: Redis did not answer."""
        if not tiers:
            return Verdict(0.0, {})
        args: list[float | int] = [BURST_S, tokens, requests]
        for t in tiers:
            args += [t.rpm, t.tpm]
        try:
            raw = await self._admit(keys=[self._key(t) for t in tiers], args=args)
        except (redis.RedisError, OSError) as e:
            self.shared.failed(e)
            return None
        self.shared.succeeded()
        wait, limit, requests_level, tokens_level = (_text(v) for v in raw)
        first = tiers[0]
        headers: dict[str, str] = {}
        if requests_level:
            headers |= bucket_headers("requests", first.rpm, float(requests_level))
        if tokens_level:
            headers |= bucket_headers("tokens", first.tpm, float(tokens_level))
        return Verdict(float(wait), headers, limit)

    async def settle(self, tiers: Sequence[Tier], delta: float) -> bool:
        """Charge ``delta`` more tokens (a refund when negative) on every tier with a token
        limit; False: Redis did not answer (the charge stands as it was)."""
        limited = [t for t in tiers if t.tpm > 0]
        if not limited or delta == 0:
            return True
        args: list[float | int] = [BURST_S, delta, *(t.tpm for t in limited)]
        try:
            await self._settle(keys=[self._key(t) for t in limited], args=args)
        except (redis.RedisError, OSError) as e:
            self.shared.failed(e)
            return False
        self.shared.succeeded()
        return True


def _text(v: bytes | str) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)
