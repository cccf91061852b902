"""Two gateways on one redis-server enforce a key's rate limit once between them: alternating
requests are admitted exactly as many times as the key's one bucket holds."""

from __future__ import annotations

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
