"""A hostile remote engine behind a real `hearth serve`: a stream that ignores ``max_tokens``
is cut there and its connection closed, a too-deep or malformed data line answers 502 at once
(not 500, not a 504 after the first-token timeout), and a 307 to another port is not followed:
the prompt never reaches it. The engine is the one tests/server/gateway/test_remote_bounds.py uses, run
on a loop of its own in this process."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from app.core.util.loop import LoopThread
from tests.conftest import listen_loopback
from tests.e2e.engines import http_request, sse_events
from tests.e2e.providers.providers_front import cli, wait_ready
from tests.e2e.serveproc import ServeProc, start_serve
from tests.server.gateway.test_remote_bounds import MODELS, Hostile, _engine_app, _target_app


@dataclass
class Rig:
    front: ServeProc
    seen: Hostile
    loop: LoopThread


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    loop = LoopThread("hostile-engine").start()
    seen: Hostile = loop.call(_make_seen(), 10)

    async def start() -> tuple[list[Any], str]:
        target, seen.target_url = await listen_loopback(_target_app(seen))
        engine, url = await listen_loopback(_engine_app(seen))
        return [target, engine], url

    runners, url = loop.call(start(), 30)
    home = tmp_path_factory.mktemp("hostile-front")
    r = cli(home, "providers", "add", "evil", url + "/v1", "--kind", "vllm")
    assert r.returncode == 0, r.stderr
    front = start_serve(home)
    try:
        wait_ready(front, "evil")
        yield Rig(front, seen, loop)
    finally:
        front.stop()
        loop.call(_release(seen), 10)
        for runner in runners:
            loop.call(runner.cleanup(), 30)
        loop.stop()


async def _make_seen() -> Hostile:
    return Hostile()  # its asyncio objects belong to the engine's loop


async def _release(seen: Hostile) -> None:
    seen.release.set()


def _chat(rig: Rig, model: str, *, stream: bool, max_tokens: int = 50) -> Any:
    body = {
        "model": f"evil/{model}",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": max_tokens,
        "stream": stream,
    }
    return http_request(rig.front.root + "/v1/chat/completions", "POST", body, timeout=60)


def test_the_engine_offers_every_hostile_model(rig: Rig) -> None:
    st, body = rig.front.get("/v1/models")
    assert st == 200
    assert {f"evil/{m}" for m in MODELS} <= {m["id"] for m in body["data"]}


def test_a_stream_that_ignores_max_tokens_ends_there(rig: Rig) -> None:
    out = _chat(rig, "forever", stream=True, max_tokens=50)
    assert out.status == 200, out.body
    events = sse_events(out.raw)
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"])
    assert text == "x" * 50
    assert [e["choices"][0]["finish_reason"] for e in events if e["choices"]][-1] == "length"
    assert out.raw.rstrip().endswith(b"data: [DONE]")
    assert rig.loop.call(asyncio.wait_for(rig.seen.closed.wait(), 30), 40) is True


@pytest.mark.parametrize("model", ["deep", "malformed"])
@pytest.mark.parametrize("stream", [False, True])
def test_bad_data_from_the_engine_is_a_502_at_once(rig: Rig, model: str, stream: bool) -> None:
    out = _chat(rig, model, stream=stream)
    if stream and out.status == 200:  # headers went out first: the error is the last event
        err = json.loads(out.raw.split(b"data: ")[-1])["error"]
    else:
        assert out.status == 502, out.body
        err = out.body["error"]
    assert err["code"] == "provider_error", err


def test_a_redirect_is_not_followed(rig: Rig) -> None:
    out = _chat(rig, "redirect", stream=False)
    assert out.status == 502, out.body
    assert "redirect" in out.body["error"]["message"]
    assert rig.seen.redirected_posts == []  # the prompt never reached the other port
    assert rig.front.alive()
