"""Replica groups end to end: a gateway `hearth serve` in front of two real `hearth serve`
engines (SmolLM2) grouped as one model id. ``session`` keeps a session on one replica,
``prefix`` sends a conversation's next turn to the replica that served its first, the
session and end user go on to the engine (``x-session-id``, ``x-user-id``, ``user``), a
``Retry-After`` answer cools its replica down (a scripted engine: a real one never asks), and
a replica SIGKILLed mid-traffic costs no request that had not started streaming; the groups
API and CLI show each member's state."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from app.core.util.loop import LoopThread
from tests.conftest import listen_loopback
from tests.e2e.engines import Engine, EngineSet, Reply
from tests.e2e.providers.providers_front import call, cli, stream_events, until, wait_ready
from tests.e2e.providers.scripted_engine import MODEL, Script, engine_app
from tests.e2e.serveproc import ServeProc, start_serve

SMOL = "SmolLM2-135M-Instruct.Q4_1"
SYSTEM = "You are a patient tutor who answers in one short sentence. " * 6


@dataclass
class Rig:
    front: ServeProc
    home: Path
    one: Engine
    two: Engine
    script: Script
    loop: LoopThread

    def member(self, engine: Engine) -> str:
        name = "one" if engine is self.one else "two"
        return f"{name}/{engine.models[SMOL]}"


@pytest.fixture(scope="module")
def rig(
    engines: EngineSet, smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Rig]:
    one = engines.hearth([smollm2_path], name="one")
    two = engines.hearth([smollm2_path], name="two")
    loop = LoopThread("scripted-engine").start()
    script = Script()
    runner, url = loop.call(listen_loopback(engine_app(script)), 30)
    home = tmp_path_factory.mktemp("groups-front")
    for name, e in (("one", one), ("two", two)):
        r = cli(home, "providers", "add", name, e.base_url, "--kind", "hearth")
        assert r.returncode == 0, r.stderr
    r = cli(home, "providers", "add", "busy", url + "/v1", "--kind", "vllm")
    assert r.returncode == 0, r.stderr
    front = start_serve(home)
    try:
        wait_ready(front, "one", "two", "busy")
        yield Rig(front, home, one, two, script, loop)
    finally:
        front.stop()
        loop.call(runner.cleanup(), 30)
        loop.stop()


def _group(rig: Rig, name: str, *members: str, **kw: Any) -> None:
    r = call(rig.front, "PUT", f"/api/v1/providers/groups/{name}", {"members": list(members), **kw})
    assert r.status in (200, 201), r.body


def _chat(rig: Rig, model: str, messages: list[dict[str, str]], **kw: Any) -> Reply:
    headers = kw.pop("headers", None)
    body = {"model": model, "messages": messages, "max_tokens": 4, "temperature": 0, **kw}
    return call(rig.front, "POST", "/v1/chat/completions", body, headers=headers)


def _route(r: Reply) -> list[str]:
    assert r.status == 200, r.body
    return r.headers["x-hearth-route"].split(",")


def test_a_group_is_listed_as_a_model_and_by_the_groups_api(rig: Rig) -> None:
    _group(rig, "smol", rig.member(rig.one), rig.member(rig.two))
    models = {m["id"]: m for m in call(rig.front, "GET", "/v1/models").body["data"]}
    assert models["smol"]["owned_by"] == "group"
    assert models["smol"]["targets"] == [rig.member(rig.one), rig.member(rig.two)]
    groups = call(rig.front, "GET", "/api/v1/providers/groups").body["groups"]
    smol = next(g for g in groups if g["name"] == "smol")
    assert smol["strategy"] == "least-busy"
    assert [m["state"] for m in smol["members"]] == ["ready", "ready"]
    r = call(rig.front, "PUT", "/api/v1/providers/groups/one", {"members": ["two"]})
    assert r.status == 400 and "prefix 'one/'" in r.body["error"]["message"], r.body
    r = call(rig.front, "PUT", "/api/v1/providers/groups/x", {"members": ["nobody"]})
    assert r.status == 400 and r.body["error"]["param"] == "members", r.body
    assert call(rig.front, "DELETE", "/api/v1/providers/groups/nothing").status == 404


def test_one_session_stays_on_one_replica(rig: Rig) -> None:
    _group(rig, "sess", rig.member(rig.one), rig.member(rig.two), strategy="session")
    hi = [{"role": "user", "content": "Say hello."}]
    homes = set()
    for session in ("alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi"):
        routes = {
            tuple(_route(_chat(rig, "sess", hi, headers={"x-session-id": session})))
            for _ in range(2)
        }
        assert len(routes) == 1 and len(next(iter(routes))) == 1, routes
        homes |= routes
    assert len(homes) == 2  # the sessions are spread over both replicas, each kept on its own
    # the body's user is the key when no header names a session (OpenAI ``user``)
    by_user = {tuple(_route(_chat(rig, "sess", hi, user="dave"))) for _ in range(2)}
    assert len(by_user) == 1, by_user


def _hold_stream(rig: Rig, model: str) -> http.client.HTTPConnection:
    """A streamed request on ``model`` that has sent its first token (so it is in flight)."""
    u = urlsplit(rig.front.root)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=300)
    body = {"model": model, "stream": True, "max_tokens": 200, "temperature": 0,
            "messages": [{"role": "user", "content": "Count from one to one hundred."}]}  # fmt: skip
    conn.request(
        "POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"}
    )
    resp = conn.getresponse()
    assert resp.status == 200
    head = b""
    while b'"content"' not in head:
        head += resp.read1(65536)
    return conn


def test_a_follow_up_turn_goes_to_the_replica_that_served_the_first(rig: Rig) -> None:
    _group(rig, "pre", rig.member(rig.one), rig.member(rig.two), strategy="prefix")
    busy = _hold_stream(rig, "pre")  # one replica busy: the first turn goes to the other
    try:
        first = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "What is 2+2?"}]
        r1 = _chat(rig, "pre", first)
        served = _route(r1)[-1]
    finally:
        busy.close()
    # now both replicas are idle, and least-busy alone would pick the first member
    answer = r1.body["choices"][0]["message"]["content"] or "4"
    follow = [*first, {"role": "assistant", "content": answer},
              {"role": "user", "content": "And 3+3?"}]  # fmt: skip
    for _ in range(2):
        assert _route(_chat(rig, "pre", follow)) == [served]
    assert served == rig.member(rig.two)  # the held stream took the first member


def test_the_session_and_the_user_are_sent_on_to_the_engine(rig: Rig) -> None:
    _group(rig, "fwd", f"busy/{MODEL}")
    hi = [{"role": "user", "content": "Say hello."}]
    r = _chat(rig, "fwd", hi, headers={"x-session-id": "s-42"}, user="u-7")
    assert _route(r) == [f"busy/{MODEL}"]
    headers, body = rig.script.seen[-1]
    assert headers["x-session-id"] == "s-42" and headers["x-user-id"] == "u-7"
    assert body["user"] == "u-7"
    anthropic = {"model": "fwd", "max_tokens": 4, "messages": hi, "metadata": {"user_id": "u-8"}}
    assert call(rig.front, "POST", "/v1/messages", anthropic).status == 200
    assert rig.script.seen[-1][0]["x-user-id"] == "u-8"  # Anthropic's end user
    assert "x-session-id" not in rig.script.seen[-1][0]  # no header: only the user is sent


def test_retry_after_cools_the_replica_down(rig: Rig) -> None:
    rig.script.status, rig.script.headers = 429, {"Retry-After": "120"}
    _group(rig, "cool", f"busy/{MODEL}", rig.member(rig.one))
    hi = [{"role": "user", "content": "Say hello."}]
    r = _chat(rig, "cool", hi)
    assert _route(r) == [f"busy/{MODEL}", rig.member(rig.one)]  # tried, then the other
    asked = len(rig.script.seen)
    for _ in range(2):
        assert _route(_chat(rig, "cool", hi)) == [rig.member(rig.one)]
    assert len(rig.script.seen) == asked  # not asked again while it cools down
    groups = call(rig.front, "GET", "/api/v1/providers/groups").body["groups"]
    cool = next(g for g in groups if g["name"] == "cool")
    assert cool["members"][0]["state"] == "cooling"
    # the CLI shows the running server's view: the member cooling down, not a fresh check
    listed = cli(rig.home, "providers", "groups", "--json")
    assert listed.returncode == 0, listed.stderr
    by_name = {g["name"]: g for g in json.loads(listed.stdout)}
    assert set(by_name) >= {"smol", "sess", "pre", "cool"}
    assert [m["state"] for m in by_name["cool"]["members"]] == ["cooling", "ready"]


def test_a_replica_killed_mid_traffic_costs_no_request_that_had_not_streamed(rig: Rig) -> None:
    _group(rig, "kill", rig.member(rig.one), rig.member(rig.two))
    count = [{"role": "user", "content": "Count from one to twenty."}]

    def plain(_: int) -> Reply:
        return _chat(rig, "kill", count, max_tokens=24)

    def streamed(_: int) -> tuple[int, list[Any], bool, str]:
        r = _chat(rig, "kill", count, max_tokens=24, stream=True)
        events, done = stream_events(r.raw)
        return r.status, events, done, r.headers.get("x-hearth-route", "")

    with ThreadPoolExecutor(8) as pool:
        wave = [pool.submit(plain, i) for i in range(4)]
        waves = [pool.submit(streamed, i) for i in range(2)]
        busy = _hold_stream(rig, "kill")  # traffic is under way on both replicas
        rig.two.kill()
        after = [pool.submit(plain, i) for i in range(4)]
        after_s = [pool.submit(streamed, i) for i in range(2)]
        busy.close()
        before = [f.result() for f in wave] + [f.result() for f in waves]
        later = [f.result() for f in after] + [f.result() for f in after_s]
    for r in later[:4]:  # sent after the kill: every one answered, by the replica left
        assert _route(r)[-1] == rig.member(rig.one)
    for status, events, done, route in later[4:]:
        assert status == 200 and done and route.split(",")[-1] == rig.member(rig.one), events
    for r in before[:4]:  # in flight at the kill: a non-streamed answer is whole or a clear error
        if r.status != 200:  # type: ignore[union-attr]
            assert r.body["error"]["code"].startswith("provider"), r.body  # type: ignore[union-attr]
    until(
        "the killed replica shown as down",
        lambda: any(
            m["state"] in ("unreachable", "open")
            for g in call(rig.front, "GET", "/api/v1/providers/groups").body["groups"]
            if g["name"] == "kill"
            for m in g["members"]
        ),
    )
