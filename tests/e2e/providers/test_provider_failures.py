"""Failures of remote engines, end to end with real processes: a chain's next
target answers when the first was killed (kill -9) or stopped (SIGSTOP: the first-token
timeout), a kill mid-stream ends the stream with an error event and no [DONE] (never a spliced
second answer), a wrong remote key is a 401 at once with no fallback, a provider that is down
answers 503 provider_unavailable and lists nothing, and the canary key never appears anywhere."""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.e2e.engines import Engine, EngineSet, free_port, http_request
from tests.e2e.providers.providers_front import (
    call,
    cli,
    model_ids,
    provider_state,
    until,
    wait_ready,
)
from tests.e2e.serveproc import ServeProc, start_serve

CANARY = "sk-canary-5f1e0c9d7b3a"  # a wrong key for provider `badkey`
LAN_KEY = "right-key-for-the-engine"
HI = [{"role": "user", "content": "Say hello to me."}]
SMOL = "SmolLM2-135M-Instruct.Q4_1"


@pytest.fixture(scope="module")
def victim(engines: EngineSet, smollm2_path: Path) -> Engine:
    return engines.hearth([smollm2_path], name="victim")


@pytest.fixture(scope="module")
def sleepy(engines: EngineSet, smollm2_path: Path) -> Engine:
    return engines.hearth([smollm2_path], name="sleepy")


@pytest.fixture(scope="module")
def cutter(engines: EngineSet, smollm2_path: Path) -> Engine:
    return engines.hearth([smollm2_path], name="cutter")


@pytest.fixture(scope="module")
def locked(engines: EngineSet, smollm2_path: Path) -> Engine:
    return engines.hearth([smollm2_path], name="locked", api_key=LAN_KEY)


@pytest.fixture(scope="module")
def front(
    tmp_path_factory: pytest.TempPathFactory,
    smollm2_path: Path,
    victim: Engine,
    sleepy: Engine,
    cutter: Engine,
    locked: Engine,
) -> Iterator[ServeProc]:
    home = tmp_path_factory.mktemp("front")
    adds = [
        ("victim", victim.base_url, "--kind", "hearth"),
        ("sleepy", sleepy.base_url, "--kind", "hearth", "--first-token-timeout", "3"),
        ("cutter", cutter.base_url, "--kind", "hearth"),
        ("badkey", locked.base_url, "--kind", "hearth", "--api-key", CANARY),
        ("down", f"http://127.0.0.1:{free_port()}/v1", "--kind", "vllm"),
        ("idle", sleepy.base_url, "--kind", "hearth", "--idle-timeout", "2"),
    ]
    for a in adds:
        r = cli(home, "providers", "add", *a)
        assert r.returncode == 0, r.stderr
    # -vv: debug logging, so the canary test reads everything the server would ever log
    s = start_serve(home, smollm2_path, verbose=2)
    local = s.models[SMOL]
    for alias, first in (("kill-chain", "victim"), ("stop-chain", "sleepy"),
                         ("cut-chain", "cutter"), ("key-chain", "badkey")):  # fmt: skip
        r = cli(home, "alias", "set", alias, f"{first}/{local}", local)
        assert r.returncode == 0, r.stderr
    try:
        wait_ready(s, "victim", "sleepy", "cutter", "idle")
        yield s
    finally:
        s.stop()


def _remote(front: ServeProc, provider: str) -> str:
    return f"{provider}/{front.models[SMOL]}"


def test_kill_9_first_target_falls_back_to_the_next(front: ServeProc, victim: Engine) -> None:
    assert call(front, "POST", "/v1/chat/completions",
                {"model": _remote(front, "victim"), "messages": HI, "max_tokens": 3}).status == 200  # fmt: skip
    victim.kill()
    r = call(
        front,
        "POST",
        "/v1/chat/completions",
        {"model": "kill-chain", "messages": HI, "max_tokens": 3},
    )
    assert r.status == 200, r.body
    local = front.models[SMOL]
    assert r.body["model"] == local
    assert r.headers["x-hearth-route"] == f"{_remote(front, 'victim')},{local}"
    # the pool probes it at once: its models leave the list, its state says why
    until("victim unreachable", lambda: provider_state(front, "victim") == "unreachable")
    assert _remote(front, "victim") not in model_ids(front)


def test_sigstop_times_out_before_the_first_token_then_falls_back(
    front: ServeProc, sleepy: Engine
) -> None:
    model = _remote(front, "sleepy")
    # load the model there first, straight (a load on a busy machine may take longer than the
    # provider's 3 s first-token bound), then once through the front: only the stop delays it
    local = http_request(
        sleepy.root + "/v1/chat/completions",
        "POST",
        {"model": sleepy.models[SMOL], "messages": HI, "max_tokens": 2},
    )
    assert local.status == 200, local.body
    # the warm-up is bound by the same 3 s: on a loaded machine a first try may run past it
    for _ in range(5):
        warm = call(
            front, "POST", "/v1/chat/completions", {"model": model, "messages": HI, "max_tokens": 2}
        )
        if warm.status != 504:
            break
    assert warm.status == 200, warm.body
    sleepy.stop()
    try:
        t0 = time.monotonic()
        r = call(
            front, "POST", "/v1/chat/completions", {"model": model, "messages": HI, "max_tokens": 2}
        )
        assert r.status == 504 and r.body["error"]["code"] == "provider_timeout", r.body
        assert time.monotonic() - t0 >= 3.0  # its --first-token-timeout
        assert "sleepy" in r.body["error"]["message"]
        r = call(
            front, "POST", "/v1/messages", {"model": "stop-chain", "max_tokens": 3, "messages": HI}
        )
        assert r.status == 200, r.body
        assert r.body["model"] == front.models[SMOL]
        assert r.headers["x-hearth-route"] == f"{model},{front.models[SMOL]}"
    finally:
        sleepy.cont()
    until("sleepy ready again", lambda: provider_state(front, "sleepy") == "ready")


LONG = {
    "type": "json_schema",
    "json_schema": {
        "name": "s",
        "schema": {
            "type": "object",
            "properties": {"s": {"type": "string", "minLength": 1000}},
            "required": ["s"],
        },
    },
}


def _stream_then(front: ServeProc, model: str, act: Callable[[], None]) -> tuple[str | None, str]:
    """Stream a long answer (the schema forces 1,000+ characters) from ``model``; once its
    first content chunk came, ``act()``; then read to the end. (route header, the rest)."""
    body = {"model": model, "messages": HI, "max_tokens": 2000, "stream": True,
            "response_format": LONG}  # fmt: skip
    u = urlsplit(front.root)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=300)
    try:
        conn.request(
            "POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"}
        )
        resp = conn.getresponse()
        assert resp.status == 200
        head = b""
        while b'"content"' not in head:  # the first token has come through
            head += resp.read1(65536)
        act()
        rest = b""
        while chunk := resp.read1(65536):
            rest += chunk
        return resp.getheader("x-hearth-route"), rest.decode(errors="replace")
    finally:
        conn.close()


def _error_events(tail: str) -> list[dict[str, Any]]:
    return [
        json.loads(x[5:]) for x in tail.splitlines() if x.startswith("data:") and '"error"' in x
    ]


def test_idle_timeout_mid_stream_ends_with_an_error_event(front: ServeProc, sleepy: Engine) -> None:
    """`--idle-timeout 2`: an engine that stops sending (SIGSTOP) mid-stream is given up on."""
    until("sleepy ready", lambda: provider_state(front, "idle") == "ready")
    try:
        _, tail = _stream_then(front, _remote(front, "idle"), sleepy.stop)
    finally:
        sleepy.cont()
    assert "[DONE]" not in tail
    errors = _error_events(tail)
    assert errors and "idle timeout" in errors[-1]["error"]["message"], tail[-600:]


def test_kill_mid_stream_ends_with_an_error_event_and_no_done(
    front: ServeProc, cutter: Engine
) -> None:
    """The schema forces 1,000+ characters, so the engine is far from done when the first
    chunk arrives and it is killed: the rest is an error event, not [DONE], and the chain's
    next target never adds a second answer."""
    route, tail = _stream_then(front, "cut-chain", cutter.kill)
    assert route == _remote(front, "cutter")
    assert "[DONE]" not in tail
    errors = _error_events(tail)
    assert errors and "cutter" in errors[-1]["error"]["message"], tail[-800:]
    assert tail.rstrip().endswith("}")  # the error event is the last thing sent


def test_a_wrong_remote_key_is_401_at_once_with_no_fallback(front: ServeProc) -> None:
    until("badkey probed", lambda: provider_state(front, "badkey") == "unauthorized")
    r = call(
        front,
        "POST",
        "/v1/chat/completions",
        {"model": "key-chain", "messages": HI, "max_tokens": 3},
    )
    assert r.status == 401, r.body
    assert r.body["error"]["code"] == "provider_unauthorized"
    assert r.headers["x-hearth-route"] == _remote(front, "badkey")  # the local model never tried
    a = call(front, "POST", "/v1/messages", {"model": "key-chain", "max_tokens": 3, "messages": HI})
    assert a.status == 401 and a.body["error"]["type"] == "authentication_error", a.body
    t = cli(front.home, "providers", "test", "badkey")
    assert t.returncode == 1 and "unauthorized" in t.stderr


def test_a_provider_that_is_down_answers_503_and_lists_nothing(front: ServeProc) -> None:
    until("down probed", lambda: provider_state(front, "down") == "unreachable")
    r = call(front, "POST", "/v1/chat/completions", {"model": "down/llama-3-8b", "messages": HI})
    assert r.status == 503, r.body
    assert (
        r.body["error"]["code"] == "provider_unavailable" and "'down'" in r.body["error"]["message"]
    )
    assert "retry-after" in r.headers
    assert not [m for m in model_ids(front) if m.startswith("down/")]
    # its model routes too: 503 with the reason, not a 404 (nor a 400)
    one = call(front, "GET", "/v1/models/down/llama-3-8b")
    assert one.status == 503 and one.body["error"]["code"] == "provider_unavailable", one.body
    shown = call(front, "POST", "/api/show", {"model": "down/llama-3-8b"})
    assert shown.status == 503 and "'down'" in shown.body["error"], shown.body
    ls = json.loads(cli(front.home, "providers", "ls", "--json").stdout)
    down = next(p for p in ls if p["name"] == "down")
    assert down["state"] == "unreachable" and down["models"] == [] and down["error"]
    t = cli(front.home, "providers", "test", "down")
    assert t.returncode == 1 and "health: unreachable" in t.stderr


def test_the_canary_key_never_appears(front: ServeProc) -> None:
    """After every request above (and a few more here), the wrong key is nowhere: not in the
    server's debug log, any file but the keys file, any answer or listing, the CLI's output."""
    seen: list[str] = []
    for path in ("/v1/models", "/health", "/api/tags", "/v1/models/" + _remote(front, "badkey")):
        seen.append(call(front, "GET", path).raw.decode(errors="replace"))
    for body in ({"model": _remote(front, "badkey"), "messages": HI},
                 {"model": _remote(front, "badkey"), "messages": HI, "stream": True}):  # fmt: skip
        seen.append(call(front, "POST", "/v1/chat/completions", body).raw.decode(errors="replace"))
    seen.append(
        call(
            front, "POST", "/api/chat", {"model": _remote(front, "badkey"), "messages": HI}
        ).raw.decode()
    )
    for args in (("providers", "ls", "--json"), ("providers", "ls"), ("providers", "test", "badkey"),
                 ("alias", "ls", "--json")):  # fmt: skip
        r = cli(front.home, *args)
        seen += [r.stdout, r.stderr]
    for f in front.home.rglob("*"):
        if f.is_file() and f.name != "provider_keys.json" and f.stat().st_size < 50_000_000:
            seen.append(f.read_text(errors="replace"))  # serve.stderr (-vv) among them
    assert any("badkey" in s for s in seen)  # the search did reach what names the provider
    leaks = [s[max(0, s.find(CANARY) - 200) : s.find(CANARY) + 50] for s in seen if CANARY in s]
    assert not leaks, leaks
    keys = front.home / "config" / "provider_keys.json"
    assert CANARY in keys.read_text() and (keys.stat().st_mode & 0o777) == 0o600
