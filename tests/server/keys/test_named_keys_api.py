"""Named keys on the real server: auth once any key exists, the default key, roles,
--models scopes that look exactly like unknown models, and token-bucket rate limits on a
frozen clock (two keys, 50 concurrent requests, tokens settled with real usage)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.core.gateway.keys import KeyStore
from app.settings import LimitsSettings, SettingsStore
from tests.conftest import Served, serving, stop_served

pytestmark = pytest.mark.model

DEFAULT = "the-default-key-0123456789"


class Clock:
    def __init__(self) -> None:
        self.t = 5000.0

    def __call__(self) -> float:
        return self.t


@dataclass
class Keyed:
    s: Served
    clock: Clock
    keys: dict[str, str]  # name -> secret
    emb_id: str
    settings: SettingsStore

    def url(self, path: str) -> str:
        return self.s.root + path

    def get(self, path: str, key: str | None = None, **kw: object) -> httpx.Response:
        return httpx.get(self.url(path), headers=auth(key), timeout=60, **kw)  # type: ignore[arg-type]

    def post(self, path: str, body: object, key: str | None = None) -> httpx.Response:
        return httpx.post(self.url(path), json=body, headers=auth(key), timeout=120)


def auth(key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"} if key else {}


@pytest.fixture(scope="module")
def keyed(
    tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path, embedding_gguf: Path
) -> Iterator[Keyed]:
    secrets = {
        "admin": "k-admin-0123456789",
        "six": "k-six-0123456789",
        "free": "k-free-0123456789",
        "scoped": "k-scoped-0123456789",
        "sixty": "k-sixty-0123456789",
        "tokens": "k-tokens-0123456789",
        "t300": "k-t300-0123456789",
    }
    made: dict[str, Any] = {}

    def prepare(service: Any, paths: Any, store: SettingsStore) -> None:
        smol = next(s.model for s in service.models.all())
        emb, _ = service.models.import_path(embedding_gguf)
        service.routing.set_alias("smol-alias", [smol.id])
        service.routing.set_alias("emb-alias", [emb.id])
        ks = KeyStore(paths.keys_file)
        ks.add("admin", secrets["admin"], admin=True)
        ks.add("six", secrets["six"], rpm=6)
        ks.add("free", secrets["free"])
        ks.add("scoped", secrets["scoped"], models=[smol.id[:4] + "*"])
        ks.add("sixty", secrets["sixty"], rpm=60)
        ks.add("tokens", secrets["tokens"], tpm=600)
        ks.add("t300", secrets["t300"], tpm=300)
        made.update(emb=emb.id, store=store)

    clock = Clock()
    home = tmp_path_factory.mktemp("keys")
    with serving(home, smollm2_path, prepare=prepare, clock=clock, api_key=DEFAULT) as s:
        yield Keyed(s, clock, secrets, made["emb"], made["store"])


@pytest.fixture(autouse=True)
def _refill(keyed: Keyed) -> None:
    keyed.clock.t += 3600  # every bucket full again: tests do not share spent limits


def test_every_route_but_health_needs_a_key(keyed: Keyed) -> None:
    assert keyed.get("/health").status_code == 200
    for path in ("/v1/models", "/api/tags", "/api/v1/models", "/api/v1/ps"):
        r = keyed.get(path)
        assert r.status_code == 401, path
        r = keyed.get(path, "wrong-key")
        assert r.status_code == 401, path
    assert keyed.get("/v1/models").json()["error"]["code"] == "invalid_api_key"
    r = httpx.get(keyed.url("/v1/models"), headers={"x-api-key": keyed.keys["free"]})
    assert r.status_code == 200
    assert keyed.get("/v1/models", DEFAULT).status_code == 200  # --api-key: the "default" key


def test_non_admin_keys_are_refused_management_routes(keyed: Keyed) -> None:
    mid = keyed.s.model_id
    calls = [
        ("POST", "/api/v1/models/load", {"model": mid}),
        ("POST", "/api/v1/models/unload", {"model": mid}),
        ("POST", "/api/v1/models/pin", {"model": mid}),
        ("PUT", f"/api/v1/models/{mid}/preset", {}),
        ("GET", f"/api/v1/models/{mid}/preset", None),
        ("POST", "/api/v1/pull", {"model": "org/repo"}),
        ("GET", "/api/v1/downloads", None),
    ]
    for method, path, body in calls:
        r = httpx.request(method, keyed.url(path), json=body, headers=auth(keyed.keys["free"]))
        assert r.status_code == 403, path
        err = r.json()["error"]
        assert err["code"] == "permission_denied" and err["type"] == "invalid_request_error"
    # the Ollama family answers in Ollama's shape
    r = httpx.post(keyed.url("/api/pull"), json={"model": "x"}, headers=auth(keyed.keys["free"]))
    assert r.status_code == 403 and isinstance(r.json()["error"], str)
    # admin keys (and the default key) pass the role check
    for key in (keyed.keys["admin"], DEFAULT):
        assert keyed.get("/api/v1/downloads", key).status_code == 200
        assert keyed.get(f"/api/v1/models/{mid}/preset", key).status_code == 200
    # not management: any key
    assert keyed.get("/api/v1/ps", keyed.keys["free"]).status_code == 200


def _ids(r: httpx.Response, field: str = "data", key: str = "id") -> set[str]:
    assert r.status_code == 200, r.text
    return {m[key] for m in r.json()[field]}


def test_a_scoped_key_sees_only_its_models(keyed: Keyed) -> None:
    smol, emb, key = keyed.s.model_id, keyed.emb_id, keyed.keys["scoped"]
    everything = _ids(keyed.get("/v1/models", keyed.keys["free"]))
    assert {smol, emb, "smol-alias", "emb-alias"} <= everything
    assert _ids(keyed.get("/v1/models", key)) == {smol, "smol-alias"}
    assert _ids(keyed.get("/api/v1/models", key), "models") == {smol}
    tags = {m["name"].removesuffix(":latest") for m in keyed.get("/api/tags", key).json()["models"]}
    assert tags == {smol, "smol-alias"}
    assert keyed.get(f"/v1/models/{smol}", key).status_code == 200


def _as_unknown(r: httpx.Response, name: str) -> tuple[int, str]:
    return r.status_code, r.text.replace(name, "NAME")


def test_out_of_scope_models_answer_exactly_as_unknown_ones(keyed: Keyed) -> None:
    emb, key, admin = keyed.emb_id, keyed.keys["scoped"], keyed.keys["admin"]
    unknown = "no-such-model-here"
    cases = [
        ("/v1/embeddings", lambda m: {"model": m, "input": "hi"}),
        (
            "/v1/chat/completions",
            lambda m: {"model": m, "messages": [{"role": "user", "content": "x"}]},
        ),
        ("/api/embed", lambda m: {"model": m, "input": "hi"}),
        ("/api/show", lambda m: {"model": m}),
        ("/tokenize", lambda m: {"model": m, "content": "hi"}),
        ("/api/v1/models/estimate", lambda m: {"model": m}),
    ]
    for path, body in cases:
        hidden = keyed.post(path, body(emb), key)
        missing = keyed.post(path, body(unknown), admin)
        assert hidden.status_code == 404, (path, hidden.text)
        assert _as_unknown(hidden, emb) == _as_unknown(missing, unknown), path
    assert keyed.post("/v1/embeddings", {"model": emb, "input": "hi"}, admin).status_code == 200
    r = keyed.get(f"/v1/models/{emb}", key)
    assert _as_unknown(r, emb) == _as_unknown(keyed.get(f"/v1/models/{unknown}", admin), unknown)
    # an alias standing only for hidden models is hidden too (aliases resolve first)
    hidden = keyed.post("/v1/embeddings", {"model": "emb-alias", "input": "hi"}, key)
    missing = keyed.post("/v1/embeddings", {"model": unknown, "input": "hi"}, admin)
    assert _as_unknown(hidden, "emb-alias") == _as_unknown(missing, unknown)


def test_six_rpm_key_gets_429_on_its_second_rapid_request_and_others_do_not(keyed: Keyed) -> None:
    six, free = keyed.keys["six"], keyed.keys["free"]
    first = keyed.get("/v1/models", six)
    assert first.status_code == 200
    assert first.headers["x-ratelimit-limit-requests"] == "6"
    assert first.headers["x-ratelimit-remaining-requests"] == "0"
    assert first.headers["x-ratelimit-reset-requests"] == "10s"
    second = keyed.get("/v1/models", six)
    assert second.status_code == 429
    assert second.headers["Retry-After"] == "10"  # 6 a minute: the next token in 10 s
    assert second.headers["x-ratelimit-limit-requests"] == "6"
    assert second.headers["x-ratelimit-remaining-requests"] == "0"
    assert second.headers["x-ratelimit-reset-requests"] == "10s"
    err = second.json()["error"]
    assert err["code"] == "rate_limit_exceeded" and err["type"] == "rate_limit_error"
    # the other key is unaffected, and has no limit headers (it has no limits)
    for _ in range(10):
        r = keyed.get("/v1/models", free)
        assert r.status_code == 200 and "x-ratelimit-limit-requests" not in r.headers
    # each protocol's own shape: Anthropic and Ollama routes refuse in theirs
    r = keyed.post("/v1/messages", {"model": "x", "max_tokens": 1, "messages": []}, six)
    assert r.status_code == 429 and r.json()["error"]["type"] == "rate_limit_error"
    assert r.json()["type"] == "error"
    r = keyed.get("/api/tags", six)
    assert r.status_code == 429 and isinstance(r.json()["error"], str)
    keyed.clock.t += 4
    assert keyed.get("/v1/models", six).headers["Retry-After"] == "6"
    keyed.clock.t += 6
    assert keyed.get("/v1/models", six).status_code == 200  # a token came back
    assert keyed.get("/health").status_code == 200  # never limited


def test_fifty_concurrent_requests_never_pass_more_than_the_bucket(keyed: Keyed) -> None:
    key = keyed.keys["sixty"]  # 60 rpm: a burst of 10

    async def burst() -> list[int]:
        async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=50)) as c:
            rs = await asyncio.gather(
                *(c.get(keyed.url("/v1/models"), headers=auth(key)) for _ in range(50))
            )
        return [r.status_code for r in rs]

    codes = asyncio.run(burst())
    assert codes.count(200) == 10 and codes.count(429) == 40
    keyed.clock.t += 3  # three tokens back, and not one more
    codes = asyncio.run(burst())
    assert codes.count(200) == 3 and codes.count(429) == 47


def test_tokens_are_settled_with_the_real_usage(keyed: Keyed) -> None:
    key = keyed.keys["tokens"]  # 600 tpm: 100 tokens at once, 10 a second
    body = {
        "model": keyed.s.model_id,
        "messages": [{"role": "user", "content": "Say hi"}],
        "max_tokens": 3,
    }
    r = keyed.post("/v1/chat/completions", body, key)
    assert r.status_code == 200, r.text
    assert r.headers["x-ratelimit-limit-tokens"] == "600"
    usage = r.json()["usage"]
    spent = usage["prompt_tokens"] + usage["completion_tokens"]
    # admission charged an estimate (body bytes / 4); the next request shows the real spend
    r = keyed.get("/v1/models", key)
    assert int(r.headers["x-ratelimit-remaining-tokens"]) == 100 - spent
    # a chat bigger than the burst waits for a full bucket, then runs it into debt that the
    # next request waits out
    long = {**body, "messages": [{"role": "user", "content": "word " * 300}]}
    assert keyed.post("/v1/chat/completions", long, key).status_code == 429
    keyed.clock.t += 60
    assert keyed.post("/v1/chat/completions", long, key).status_code == 200
    r = keyed.get("/v1/models", key)
    assert r.status_code == 429 and int(r.headers["Retry-After"]) >= 1
    assert r.headers["x-ratelimit-remaining-tokens"] == "0"


async def _chunked(body: object) -> AsyncIterator[bytes]:
    # a generator body goes out with Transfer-Encoding: chunked, no Content-Length
    raw = json.dumps(body).encode()
    yield raw[: len(raw) // 2]
    yield raw[len(raw) // 2 :]


def test_a_chunked_body_is_charged_its_prompt_and_token_cap(keyed: Keyed) -> None:
    key = keyed.keys["t300"]  # 300 tpm: 50 tokens at once, 5 a second (the clock is frozen)
    body = {
        "model": keyed.s.model_id,
        "messages": [{"role": "user", "content": "Say hi"}],  # 6 characters: about 2 tokens
        "max_tokens": 20,
    }

    async def one(c: httpx.AsyncClient) -> httpx.Response:
        url = keyed.url("/v1/chat/completions")
        return await c.post(url, content=_chunked(body), headers=auth(key))

    async def burst(n: int) -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=120) as c:
            return list(await asyncio.gather(*(one(c) for _ in range(n))))

    (r,) = asyncio.run(burst(1))
    assert r.status_code == 200, r.text
    assert "content-length" not in r.request.headers
    # charged at admission: 2 of prompt + 20 it may write (settled with the real usage after)
    assert r.headers["x-ratelimit-remaining-tokens"] == str(50 - 22)
    keyed.clock.t += 3600
    # 8 at once: two fit in the 50-token burst (22 each), the other six are refused
    rs = asyncio.run(burst(8))
    codes = [x.status_code for x in rs]
    assert codes.count(200) == 2 and codes.count(429) == 6, codes
    refused = next(x for x in rs if x.status_code == 429)
    assert refused.json()["error"]["code"] == "rate_limit_exceeded"
    assert int(refused.headers["Retry-After"]) >= 1


def test_a_request_over_a_whole_minute_of_tokens_is_refused_at_once(keyed: Keyed) -> None:
    key = keyed.keys["t300"]
    msgs = [{"role": "user", "content": "Say hi"}]
    for extra in ({"max_tokens": 400}, {}):  # none: counted as 4,096 it may write
        body = {"model": keyed.s.model_id, "messages": msgs, **extra}
        r = keyed.post("/v1/chat/completions", body, key)
        assert r.status_code == 429, r.text
        err = r.json()["error"]
        assert err["code"] == "request_over_rate_limit"
        assert "300 tokens per minute" in err["message"] and "max_tokens" in err["message"]
        assert "Retry-After" not in r.headers and r.headers["x-should-retry"] == "false"
    # refused without charging: the key's tokens are all there
    r = keyed.get("/v1/models", key)
    assert r.status_code == 200 and r.headers["x-ratelimit-remaining-tokens"] == "50"


def test_the_global_limit_applies_to_every_key(keyed: Keyed) -> None:
    old = keyed.settings.load()
    keyed.settings.update(limits=LimitsSettings(rpm=12))  # 2 at once, server-wide
    try:
        a = keyed.get("/v1/models", keyed.keys["free"])
        assert a.status_code == 200 and a.headers["x-ratelimit-limit-requests"] == "12"
        assert keyed.get("/v1/models", DEFAULT).status_code == 200
        r = keyed.get("/v1/models", keyed.keys["admin"])
        assert r.status_code == 429 and r.headers["Retry-After"] == "5"
        assert keyed.get("/health").status_code == 200
    finally:
        keyed.settings.update(limits=replace(old.limits))
    assert keyed.get("/v1/models", keyed.keys["admin"]).status_code == 200


def _cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HEARTH_HOME": str(home), "PYTHONPATH": os.getcwd()}
    return subprocess.run(
        [sys.executable, "-m", "app", *args], env=env, capture_output=True, text=True, timeout=120
    )


def test_cli_changes_take_effect_at_once_and_last_use_is_recorded(keyed: Keyed) -> None:
    home = keyed.s.home
    p = _cli(home, "keys", "add", "late", "--models", keyed.s.model_id, "--rpm", "600")
    assert p.returncode == 0, p.stderr
    secret = p.stdout.strip()
    assert p.stdout == secret + "\n" and secret not in (home / "config" / "keys.json").read_text()
    r = keyed.get("/v1/models", secret)  # no restart, no wait
    assert r.status_code == 200 and _ids(r) == {keyed.s.model_id, "smol-alias"}
    assert r.headers["x-ratelimit-limit-requests"] == "600"
    assert _cli(home, "keys", "rm", "late").returncode == 0
    assert keyed.get("/v1/models", secret).status_code == 401
    listed = json.loads(_cli(home, "keys", "ls", "--json").stdout)
    assert {k["name"] for k in listed} == {
        *("admin", "six", "free", "scoped", "sixty", "tokens", "t300")
    }
    for k in listed:
        assert set(k) == {"name", "rpm", "tpm", "models", "admin", "created_at", "last_used_at"}
        assert "hash" not in json.dumps(k)
    from app.server.state import STATE

    guard = keyed.s.controller._app[STATE].guard  # type: ignore[attr-defined]
    guard.flush()  # what the server does every 30 s and when it stops
    used = {k.name: k.last_used_at for k in KeyStore(home / "config" / "keys.json").all().values()}
    assert used["free"] is not None and used["six"] is not None
    assert _cli(home, "keys", "rm", "nobody").returncode == 1


def test_a_named_key_is_enough_to_serve_the_lan(tmp_path: Path, smollm2_path: Path) -> None:
    from app.errors import ServerError
    from tests.conftest import start_served

    s = start_served(tmp_path / "lan", smollm2_path)
    try:
        s.call(s.controller.stop())  # type: ignore[attr-defined]
        store = KeyStore(s.home / "config" / "keys.json")
        store.add("team", "k-team-0123456789")
        s.call(s.controller.start("0.0.0.0", 0))  # type: ignore[attr-defined]
        port = s.controller.port  # type: ignore[attr-defined]
        url = f"http://127.0.0.1:{port}/v1/models"
        assert httpx.get(url).status_code == 401
        assert httpx.get(url, headers=auth("k-team-0123456789")).status_code == 200
        assert store.all()["team"].last_used_at is None  # not written per request
        s.call(s.controller.stop())  # type: ignore[attr-defined]
        assert store.all()["team"].last_used_at is not None  # written as the server stopped
        store.remove("team")
        with pytest.raises(ServerError, match="API key"):
            s.call(s.controller.start("0.0.0.0", 0))  # type: ignore[attr-defined]
    finally:
        stop_served(s)


def test_a_limited_keys_streams_carry_the_headers(keyed: Keyed) -> None:
    body = {
        "model": keyed.s.model_id,
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 2,
        "stream": True,
    }
    with httpx.stream(
        "POST",
        keyed.url("/v1/chat/completions"),
        json=body,
        headers=auth(keyed.keys["sixty"]),
        timeout=60,  # a first request loads the model: a liveness bound, not a speed one
    ) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        assert r.headers["x-ratelimit-limit-requests"] == "60"
        assert r.headers["x-ratelimit-remaining-requests"] == "9"
        assert r.headers["x-ratelimit-reset-requests"] == "1s"
        text = "".join(r.iter_text())
    assert text.rstrip().endswith("data: [DONE]")
