"""Token buckets for requests and tokens per minute (issue 14).

A bucket refills at ``per_minute / 60`` a second and holds at most ten seconds of that
(``BURST_S``; at least 1): OpenAI documents its per-minute limits as "quantized", enforced
over shorter periods, so a client that spends a minute's allowance at once is refused there
too. At 6 rpm that is one request every 10 s, never six at once. The clock is injected
(tests freeze it); every call happens on the server's loop, so admission is atomic."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

Clock = Callable[[], float]
BURST_S = 10.0  # the burst: this many seconds' worth of the per-minute allowance


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

    def wait(self, tokens: float) -> tuple[float, str]:
        waits = []
        if self.requests is not None:
            waits.append((self.requests.wait_for(1.0), "requests"))
        if self.tokens is not None:
            waits.append((self.tokens.wait_for(tokens), "tokens"))
        return max(waits, default=(0.0, ""))

    def take(self, tokens: float) -> None:
        if self.requests is not None:
            self.requests.take(1.0)
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
            if b is None:
                continue
            h[f"x-ratelimit-limit-{kind}"] = str(b.per_minute)
            h[f"x-ratelimit-remaining-{kind}"] = str(max(0, math.floor(b.level())))
            h[f"x-ratelimit-reset-{kind}"] = duration(b.reset_in())
        return h


def admit(tiers: list[Limits], tokens: float) -> Verdict:
    """Admit a request charging 1 request and ``tokens`` on every tier (a key's own, then the
    global one), or refuse it without charging any. The headers are the first active tier's
    (the key's when it has limits)."""
    active = [t for t in tiers if t.active]
    worst = max((t.wait(tokens) for t in active), default=(0.0, ""))
    if worst[0] <= 0:
        for t in active:
            t.take(tokens)
    headers = active[0].headers() if active else {}
    return Verdict(worst[0], headers, worst[1])
