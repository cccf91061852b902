"""Two real ``hearth serve`` gateways (``--state URL``) sharing one real redis-server, both
fronting the same two engines (scripted, on loopback) grouped as one model: when one gateway
finds an engine down, the other learns it from Redis and skips it without trying it (its
``x-hearth-route`` starts with the healthy member)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from app.core.util.loop import LoopThread
from tests.conftest import listen_loopback
from tests.e2e.providers.providers_front import call, cli, until, wait_ready
from tests.e2e.providers.scripted_engine import MODEL, Script, engine_app
from tests.e2e.serveproc import ServeProc, start_serve

HI = [{"role": "user", "content": "Say hello."}]


def _gateway(home: Path, urls: dict[str, str], state: str) -> ServeProc:
    for name, url in urls.items():
        r = cli(home, "providers", "add", name, url + "/v1", "--kind", "vllm")
        assert r.returncode == 0, r.stderr
    r = cli(home, "providers", "group", "tiny", f"dead/{MODEL}", f"live/{MODEL}")
    assert r.returncode == 0, r.stderr
    front = start_serve(home, args=("--state", state))
    wait_ready(front, *urls)
    return front


def _member(front: ServeProc, target: str) -> dict[str, Any]:
    groups = call(front, "GET", "/api/v1/providers/groups").body["groups"]
    return next(m for m in groups[0]["members"] if m["target"] == target)


def test_one_gateway_finding_an_engine_down_spares_the_other_the_try(
    tmp_path: Path, redis_server: Any
) -> None:
    loop = LoopThread("scripted-engines").start()
    dead_runner, dead_url = loop.call(listen_loopback(engine_app(Script())), 30)
    live_runner, live_url = loop.call(listen_loopback(engine_app(Script())), 30)
    urls = {"dead": dead_url, "live": live_url}
    fronts: list[ServeProc] = []
    try:
        fronts.append(_gateway(tmp_path / "a", urls, redis_server.url))
        fronts.append(_gateway(tmp_path / "b", urls, redis_server.url))
        a, b = fronts
        loop.call(dead_runner.cleanup(), 30)  # the engine dies; neither gateway knows yet
        body = {"model": "tiny", "messages": HI, "max_tokens": 2}
        r = call(a, "POST", "/v1/chat/completions", body)
        assert r.status == 200, r.body
        assert r.headers["x-hearth-route"] == f"dead/{MODEL},live/{MODEL}"  # A tried it
        # B learns it from Redis (the mark A left, not a probe of its own)
        until(
            "B to read A's mark",
            lambda: _member(b, f"dead/{MODEL}")["error"] == "a request could not reach it",
        )
        assert _member(b, f"dead/{MODEL}")["state"] == "unreachable"
        for _ in range(2):
            r = call(b, "POST", "/v1/chat/completions", body)
            assert r.status == 200, r.body
            assert r.headers["x-hearth-route"] == f"live/{MODEL}"  # never tried there
    finally:
        for f in fronts:
            f.stop()
        loop.call(live_runner.cleanup(), 30)
        loop.stop()
