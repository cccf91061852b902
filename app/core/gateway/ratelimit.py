"""Token buckets for requests and tokens per minute .

A bucket refills at ``per_minute / 60`` a second and holds at most ten seconds of that
(``BURST_S``; at least 1): OpenAI documents its per-minute limits as "quantized", enforced
over shorter periods, so a client that spends a minute's allowance at once is refused there
too. At 6 rpm that is one request every 10 s, never six at once. The clock is injected
(tests freeze it); every call happens on the server's loop, so admission is atomic.

Tokens are charged what a request can cost once it is parsed (:func:`cost`: its prompt, about
4 characters a token, plus its token cap), through the charger the server puts on the
request's context (:func:`charge`); the edge settles the charge with the real usage after.

Several gateways sharing their limits keep the same buckets in Redis instead: a
:class:`SharedBuckets` (app/redis_state/limits.py runs the same math in one server-side script
per admission); the edge picks it while the shared state answers and these in-process buckets
otherwise."""

from __future__ import annotations

import inspect
import json
import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from app.core.requests import (
    ChatRequest,
    CompletionRequest,
    EmbeddingRequest,
    RerankRequest,
    TranscriptionRequest,
)

Charged = ChatRequest | CompletionRequest | EmbeddingRequest | RerankRequest | TranscriptionRequest

Clock = Callable[[], float]
BURST_S = 10.0  # the burst: this many seconds' worth of the per-minute allowance
# what a generation without a token cap is charged as its completion (a model may write more:
# the real usage is settled after; a cap this size keeps uncapped requests possible on most keys)
UNCAPPED_TOKENS = 4096
CHARS_PER_TOKEN = 4

# a charger may answer at once (in-process buckets) or after a round trip (shared ones)
Charger = Callable[["Cost"], Awaitable[None] | None]


@dataclass(frozen=True, slots=True)
class Cost:
    """What a request can cost: its prompt (estimated) plus the completion tokens it may write."""

    prompt: int
    completion: int = 0
    capped: bool = True  # False: no token cap was asked, ``completion`` is UNCAPPED_TOKENS each

    @property
    def total(self) -> int:
        return self.prompt + self.completion


def _estimate(chars: int) -> int:
    return -(-chars // CHARS_PER_TOKEN)  # rounded up: a non-empty text is at least one token


def _cap(max_tokens: int | None, generations: int, prompt: int) -> Cost:
    each = UNCAPPED_TOKENS if max_tokens is None else max_tokens
    return Cost(prompt, each * generations, max_tokens is not None)


def cost(req: Charged) -> Cost:
    """The most ``req`` can cost, estimated from its parsed content (never from the body's
    size on the wire): every generation's prompt plus its token cap."""
    if isinstance(req, ChatRequest):
        chars = sum(
            len(m.content) + sum(len(c.name) + len(c.arguments) for c in m.tool_calls)
            for m in req.messages
        )
        chars += sum(len(json.dumps(t.as_openai())) for t in req.tools)
        return _cap(req.max_tokens, req.n, _estimate(chars) * req.n)
    if isinstance(req, CompletionRequest):
        one = [_estimate(len(p)) if isinstance(p, str) else len(p) for p in req.prompts]
        return _cap(req.max_tokens, len(req.prompts) * req.n, sum(one) * req.n)
    if isinstance(req, TranscriptionRequest):  # the audio's length is unknown before decoding
        return Cost(_estimate(len(req.job.prompt or "")))
    if isinstance(req, EmbeddingRequest):
        return Cost(sum(_estimate(len(i)) if isinstance(i, str) else len(i) for i in req.inputs))
    return Cost(_estimate(len(req.query) * len(req.documents) + sum(map(len, req.documents))))


async def charge(req: Charged) -> None:
    """Charge the request's key (its context's charger) the most ``req`` can cost, before any
    work; nothing is limited without a charger (in process, or a server without limits).

    Raises:
        RateLimited: the limits cannot admit it (now, or ever as sent).
    """
    if req.context.charge is not None:
        pending = req.context.charge(cost(req))
        if inspect.isawaitable(pending):
            await pending


def duration(seconds: float) -> str:
    """OpenAI's ``x-ratelimit-reset-*`` style, in whole seconds rounded up: ``0s``, ``1s``,
    ``59s``, ``6m0s``, ``1h2m3s``."""
    s = max(0, math.ceil(seconds - 1e-9))
    h, rest = divmod(s, 3600)
    m, sec = divmod(rest, 60)
    if h:
        return f"{h}h{m}m{sec}s"
    if m:
        return f"{m}m{sec}s"
    return f"{sec}s"


class TokenBucket:
    def __init__(self, per_minute: int, clock: Clock) -> None:
        self.per_minute = per_minute
        self.capacity = max(1.0, per_minute * BURST_S / 60.0)
        self.rate = per_minute / 60.0  # tokens a second
        self._clock = clock
        self._level = self.capacity
        self._at = clock()

    def level(self) -> float:
        now = self._clock()
        self._level = min(self.capacity, self._level + (now - self._at) * self.rate)
        self._at = now
        return self._level

    def wait_for(self, amount: float) -> float:
        """Seconds until ``amount`` (at most the capacity) is available; 0 when it is now."""
        need = min(amount, self.capacity) - self.level()
        return 0.0 if need <= 1e-9 else need / self.rate  # float dust at the boundary is none

    def take(self, amount: float) -> None:
        """Charge ``amount``; the level may go below zero (a debt later requests wait out)."""
        self.level()
        self._level -= amount

    def refund(self, amount: float) -> None:
        self.level()
        self._level = min(self.capacity, self._level + amount)

    def reset_in(self) -> float:
        """Seconds until the bucket is full again."""
        return (self.capacity - self.level()) / self.rate


@dataclass(frozen=True, slots=True)
class Verdict:
    """The answer to one admission: ``wait`` seconds (0 = admitted) and the headers to send."""

    wait: float
    headers: dict[str, str]
    limit: str = ""  # "requests" or "tokens": which one refused


class Limits:
    """One tenant's pair of buckets (either may be absent: 0 = no limit)."""

    def __init__(self, rpm: int, tpm: int, clock: Clock) -> None:
        self.rpm, self.tpm = rpm, tpm
        self.requests = TokenBucket(rpm, clock) if rpm > 0 else None
        self.tokens = TokenBucket(tpm, clock) if tpm > 0 else None

    @property
    def active(self) -> bool:
        return self.requests is not None or self.tokens is not None

    def wait(self, tokens: float, requests: float = 1.0) -> tuple[float, str]:
        waits = []
        if self.requests is not None and requests:
            waits.append((self.requests.wait_for(requests), "requests"))
        if self.tokens is not None:
            waits.append((self.tokens.wait_for(tokens), "tokens"))
        return max(waits, default=(0.0, ""))

    def take(self, tokens: float, requests: float = 1.0) -> None:
        if self.requests is not None and requests:
            self.requests.take(requests)
        if self.tokens is not None:
            self.tokens.take(tokens)

    def settle(self, delta: float) -> None:
        """The real token count minus what admission charged."""
        if self.tokens is None or delta == 0:
            return
        if delta > 0:
            self.tokens.take(delta)
        else:
            self.tokens.refund(-delta)

    def headers(self) -> dict[str, str]:
        h: dict[str, str] = {}
        for kind, b in (("requests", self.requests), ("tokens", self.tokens)):
            if b is not None:
                h.update(bucket_headers(kind, b.per_minute, b.level()))
        return h


def bucket_headers(kind: str, per_minute: int, level: float) -> dict[str, str]:
    """One bucket's ``x-ratelimit-*`` headers (``kind``: requests or tokens) at ``level``."""
    capacity = max(1.0, per_minute * BURST_S / 60.0)
    return {
        f"x-ratelimit-limit-{kind}": str(per_minute),
        f"x-ratelimit-remaining-{kind}": str(max(0, math.floor(level))),
        f"x-ratelimit-reset-{kind}": duration((capacity - level) / (per_minute / 60.0)),
    }


def admit(tiers: list[Limits], tokens: float, requests: float = 1.0) -> Verdict:
    """Admit a request charging ``requests`` and ``tokens`` on every tier (a key's own, then
    the global one), or refuse it without charging any. A tier in token debt refuses even a
    charge of 0 tokens. The headers are the first active tier's (the key's when it has limits)."""
    active = [t for t in tiers if t.active]
    worst = max((t.wait(tokens, requests) for t in active), default=(0.0, ""))
    if worst[0] <= 0:
        for t in active:
            t.take(tokens, requests)
    headers = active[0].headers() if active else {}
    return Verdict(worst[0], headers, worst[1])


@dataclass(frozen=True, slots=True)
class Tier:
    """One tier's limits as admission sees them: ``name`` is the key's (``key:NAME``) or ""
    for the server-wide one; 0 = no limit."""

    name: str
    rpm: int
    tpm: int


class SharedBuckets(Protocol):
    """Buckets several gateways share, with :func:`admit`'s semantics (every tier charged or
    none, debts allowed, headers of the first tier). Both calls answer None when the shared
    state cannot be reached: the caller falls back to its in-process buckets."""

    @property
    def usable(self) -> bool: ...

    async def admit(
        self, tiers: Sequence[Tier], tokens: float, requests: float = 1.0
    ) -> Verdict | None: ...

    async def settle(self, tiers: Sequence[Tier], delta: float) -> bool: ...
