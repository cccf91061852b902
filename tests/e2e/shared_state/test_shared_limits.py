"""Two gateways on one redis-server enforce a key's rate limit once between them: alternating
requests are admitted exactly as many times as the key's one bucket holds, the server-wide
limit too, and a chat's tokens are charged and then settled with the real usage in Redis."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import redis

from tests.e2e.shared_state.conftest import ADMIN, Team, auth, listed, poll


def test_a_keys_requests_are_admitted_once_across_two_gateways(team: Team) -> None:
    a, b = team(2)
    st, made = a.post("/api/v1/keys", {"name": "tight", "rpm": 12}, headers=auth(ADMIN))
    assert st == 201, made
    poll(lambda: listed(b, "tight"), 10.0, "the second gateway lists the new key")
    # 12 rpm: a bucket of 2 requests, one more every 5 s; two gateways each with its own
    # bucket would admit 4 of these
    codes = [gw.get("/v1/models", headers=auth(made["key"]))[0] for gw in (a, b) * 4]
    assert sorted(codes) == [200, 200] + [429] * 6, codes


def test_the_server_wide_limit_is_shared_too(team: Team) -> None:
    a, b = team(2, limits={"rpm": 6})  # one request at once, for every key together
    codes = [gw.get("/v1/models", headers=auth(ADMIN))[0] for gw in (a, b, a, b)]
    assert sorted(codes) == [200, 429, 429, 429], codes


def test_tokens_are_charged_and_settled_in_the_shared_bucket(
    team: Team, smollm2_path: Path, redis_server: Any
) -> None:
    (gw,) = team(1, models=(smollm2_path,))
    st, made = gw.post("/api/v1/keys", {"name": "chatty", "tpm": 600}, headers=auth(ADMIN))
    assert st == 201, made
    body = {
        "model": gw.models[smollm2_path.stem],
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 1,
    }
    st, out = gw.post("/v1/chat/completions", body, headers=auth(made["key"]))
    assert st == 200, out
    used = out["usage"]["prompt_tokens"] + out["usage"]["completion_tokens"]
    charged = 1 + 1  # admission's estimate: "hi" (one token) plus max_tokens
    assert used > charged  # the chat template makes the real prompt longer
    bucket = redis.Redis.from_url(redis_server.url).hgetall("hearth:rl:key:chatty")
    # 600 tpm: a bucket of 100 tokens; at most full again by the time the request ended, the
    # settle then took the real usage's rest (beyond the estimate) from the shared bucket
    assert float(bucket[b"tl"]) <= 100 - (used - charged) + 1e-6
