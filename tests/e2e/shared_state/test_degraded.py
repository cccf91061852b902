"""Gateways whose Redis dies keep serving on their local state: every request still answered,
/health 200 with ``status: degraded`` and why, the failures counted on /metrics; once Redis is
back (empty, on the same port) /health says ok again and the limits are shared again. With
``state.limits_on_failure: closed`` a limited key is refused with 503 meanwhile."""

from __future__ import annotations

from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.serveproc import ServeProc
from tests.e2e.shared_state.conftest import ADMIN, Team, auth, listed, poll


def _sample(gw: ServeProc, name: str) -> float:
    st, text = gw.get("/metrics", headers=auth(ADMIN))
    assert st == 200
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name:
                return float(s.value)
    raise AssertionError(f"{name} is not on /metrics")


def _health(gw: ServeProc) -> dict[str, Any]:
    st, body = gw.get("/health")
    assert st == 200  # degraded still serves: a load balancer must keep it
    return body


def _new_key(a: ServeProc, b: ServeProc, name: str, rpm: int) -> str:
    st, made = a.post("/api/v1/keys", {"name": name, "rpm": rpm}, headers=auth(ADMIN))
    assert st == 201, made
    poll(lambda: listed(b, name), 10.0, "the second gateway lists the key")
    return str(made["key"])


def test_serving_goes_on_while_redis_is_down_and_sharing_resumes(
    team: Team, redis_server: Any
) -> None:
    a, b = team(2)
    assert _health(a)["shared_state"]["state"] == "ok" and _sample(a, "hearth_state_up") == 1
    steady = _new_key(a, b, "steady", 600)
    redis_server.kill()
    for gw in (a, b, a, b, a, b):
        assert gw.get("/v1/models", headers=auth(steady))[0] == 200
    for gw in (a, b):
        body = _health(gw)
        assert body["status"] == "degraded", body
        assert body["shared_state"]["state"] == "degraded" and body["shared_state"]["error"]
        assert "redis://127.0.0.1" in body["shared_state"]["url"]
        assert _sample(gw, "hearth_state_errors_total") >= 1
        assert _sample(gw, "hearth_state_up") == 0

    redis_server.start()  # the same port, and empty: it kept nothing
    for gw in (a, b):
        poll(lambda gw=gw: _health(gw)["status"] == "ok", 15.0, "ok again")  # type: ignore[misc]
    poll(lambda: listed(b, "steady"), 10.0, "the keys are back in the shared state")
    assert b.get("/v1/models", headers=auth(steady))[0] == 200
    tight = _new_key(a, b, "tight", 12)  # one bucket of 2 for both gateways again
    codes = [gw.get("/v1/models", headers=auth(tight))[0] for gw in (a, b) * 3]
    assert sorted(codes) == [200, 200] + [429] * 4, codes


def test_closed_refuses_limited_keys_with_503_while_degraded(team: Team, redis_server: Any) -> None:
    a, b = team(2, state={"limits_on_failure": "closed"})
    limited = _new_key(a, b, "limited", 600)
    st, made = a.post("/api/v1/keys", {"name": "free"}, headers=auth(ADMIN))
    assert st == 201
    free = made["key"]
    redis_server.kill()
    r = httpx.get(a.base_url + "/models", headers=auth(limited), timeout=30)
    assert r.status_code == 503 and r.headers["Retry-After"] == "1"
    assert r.json()["error"]["code"] == "state_unavailable"
    assert a.get("/v1/models", headers=auth(free))[0] == 200  # no limits: nothing to check
    assert _health(a)["status"] == "degraded"
