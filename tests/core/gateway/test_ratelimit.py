"""Token buckets on an injected clock: burst, refill, debt and settlement, OpenAI's headers."""

from __future__ import annotations

import pytest

from app.core.gateway.ratelimit import Limits, TokenBucket, admit, duration


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_duration_is_openai_style() -> None:
    assert [duration(s) for s in (0, 0.2, 1, 59.01, 60, 360, 3723)] == [
        "0s",
        "1s",
        "1s",
        "1m0s",
        "1m0s",
        "6m0s",
        "1h2m3s",
    ]


def test_bucket_burst_is_ten_seconds_and_refills_at_the_rate() -> None:
    clock = Clock()
    b = TokenBucket(60, clock)  # 1 a second, 10 at once
    assert b.capacity == 10 and b.wait_for(1) == 0
    for _ in range(10):
        b.take(1)
    assert b.wait_for(1) == pytest.approx(1.0)
    clock.t += 0.5
    assert b.wait_for(1) == pytest.approx(0.5)
    clock.t += 100
    assert b.level() == 10  # never above the burst
    assert TokenBucket(6, clock).capacity == 1  # at least one


def test_admit_refuses_without_charging_and_reports_headers() -> None:
    clock = Clock()
    lim = Limits(6, 0, clock)
    ok = admit([lim], 0)
    assert ok.wait == 0
    assert ok.headers == {
        "x-ratelimit-limit-requests": "6",
        "x-ratelimit-remaining-requests": "0",
        "x-ratelimit-reset-requests": "10s",
    }
    no = admit([lim], 0)
    assert no.wait == pytest.approx(10.0) and no.limit == "requests"
    clock.t += 4
    assert admit([lim], 0).wait == pytest.approx(6.0)  # the refusals charged nothing
    clock.t += 6
    assert admit([lim], 0).wait == 0


def test_tokens_charge_an_estimate_then_settle_to_the_real_count() -> None:
    clock = Clock()
    lim = Limits(0, 600, clock)  # 10 tokens a second, 100 at once
    assert admit([lim], 30).wait == 0
    lim.settle(70 - 30)  # the request used 70
    assert lim.tokens is not None and lim.tokens.level() == pytest.approx(30)
    v = admit([lim], 50)
    assert v.wait == pytest.approx(2.0) and v.limit == "tokens"
    assert admit([lim], 500).wait == pytest.approx(
        7.0
    )  # more than the burst waits for a full bucket
    lim.settle(-20)  # fewer used than estimated: refunded
    assert lim.tokens.level() == pytest.approx(50)


def test_a_global_tier_refuses_even_when_the_key_has_room() -> None:
    clock = Clock()
    key, glob = Limits(600, 0, clock), Limits(6, 0, clock)
    assert admit([key, glob], 0).wait == 0
    v = admit([key, glob], 0)
    assert v.wait == pytest.approx(10.0)
    assert v.headers["x-ratelimit-limit-requests"] == "600"  # the key's own headers
    assert key.requests is not None and key.requests.level() == pytest.approx(
        99
    )  # the refusal charged neither


def test_global_limits_are_settings() -> None:
    from app.errors import ConfigError
    from app.settings import settings_from_dict

    assert settings_from_dict({}).limits.rpm == 0  # off unless set
    s = settings_from_dict({"limits": {"rpm": 120, "tpm": 50000}})
    assert (s.limits.rpm, s.limits.tpm) == (120, 50000)
    assert s.to_dict()["limits"] == {"rpm": 120, "tpm": 50000}
    with pytest.raises(ConfigError):
        settings_from_dict({"limits": {"rpm": -1}})
