"""Request records on the real server: what a streamed generation records (its TTFT
against what the client saw), requests refused at the edge, content only when turned on, and
records kept across a restart."""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from app.core.gateway.keys import KeyStore
from app.core.gateway.records import read_records, status_range
from app.settings import RecordSettings
from tests.conftest import Served, start_served, stop_served
from tests.support.records import records_once, records_since

pytestmark = pytest.mark.model

KEY = "sk-records-test"
AUTH = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
DEADLINE = 60.0


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path) -> Iterator[Served]:
    s = start_served(
        tmp_path_factory.mktemp("records"), smollm2_path, api_key=KEY, max_body_bytes=4096
    )
    yield s
    stop_served(s)


def db(s: Served) -> Path:
    return s.home / "data" / "requests.sqlite"


def port(s: Served) -> int:
    return int(s.controller.port)  # type: ignore[attr-defined]


def post(
    s: Served, path: str, body: object, headers: dict[str, str] | None = None
) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port(s), timeout=DEADLINE)
    conn.request("POST", path, body=json.dumps(body), headers=AUTH if headers is None else headers)
    r = conn.getresponse()
    return r.status, r.read()


def chat(s: Served, content: str, max_tokens: int, stream: bool) -> dict[str, object]:
    return {
        "model": s.model_id,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": stream,
    }


def test_a_streamed_generation_records_ttft_within_what_the_client_saw(srv: Served) -> None:
    # the first request loads the model: its record says how long it waited for that
    t0 = time.time()
    status, _ = post(srv, "/v1/chat/completions", chat(srv, "Hello", 4, False))
    assert status == 200
    loaded = records_since(db(srv), t0, 1)[0]
    assert loaded.load_ms is not None and loaded.load_ms > 0
    assert loaded.stream is False and loaded.ttft_ms is not None

    conn = http.client.HTTPConnection("127.0.0.1", port(srv), timeout=DEADLINE)
    sent = time.monotonic()
    conn.request("POST", "/v1/chat/completions", json.dumps(chat(srv, "Count", 16, True)), AUTH)
    r = conn.getresponse()
    assert r.status == 200
    first = r.read(1)  # the body's first byte: it comes with the first token
    client_ttft_ms = (time.monotonic() - sent) * 1000
    rest = r.read()
    assert first == b"d" and b"[DONE]" in rest

    rec = records_since(db(srv), t0, 2)[0]
    assert rec.stream is True
    assert rec.ttft_ms is not None and 0 < rec.ttft_ms <= client_ttft_ms
    assert rec.total_ms >= rec.ttft_ms
    assert (rec.route, rec.protocol, rec.status, rec.error_code) == (
        "/v1/chat/completions",
        "openai",
        200,
        None,
    )
    assert (rec.model, rec.answered_by, rec.provider, rec.key) == (
        srv.model_id,
        srv.model_id,
        "local",
        "default",
    )
    assert rec.prompt_tokens > 0 and 0 < rec.completion_tokens <= 16
    assert rec.tokens_per_second is not None and rec.tokens_per_second > 0
    assert rec.queue_ms is not None and rec.queue_ms >= 0
    assert rec.load_ms is not None and rec.load_ms < loaded.load_ms  # loaded already
    assert rec.request_text is None and rec.response_text is None  # content is off by default
    assert (rec.cache, rec.trace_id) == (None, None)


def test_requests_refused_at_the_edge_are_recorded(srv: Served) -> None:
    # a record is committed shortly after its answer: each is waited for
    t0 = time.time()
    no_key = {"Content-Type": "application/json"}
    assert post(srv, "/v1/chat/completions", chat(srv, "x", 1, False), no_key)[0] == 401
    r = records_since(db(srv), t0, 1)[0]
    assert (r.status, r.error_code, r.key, r.route) == (
        401,
        "invalid_api_key",
        None,
        "/v1/chat/completions",
    )

    assert post(srv, "/v1/chat/completions", {}, {**AUTH, "Host": "evil.example"})[0] == 403
    r = records_since(db(srv), t0, 2)[0]
    assert (r.status, r.error_code) == (403, "forbidden")

    big = chat(srv, "x" * 8000, 1, False)
    assert post(srv, "/v1/chat/completions", big)[0] == 413
    r = records_since(db(srv), t0, 3)[0]
    assert (r.status, r.error_code, r.key) == (413, "request_too_large", "default")

    assert post(srv, "/api/chat", {"model": "no-such-model", "messages": []})[0] == 404
    r = records_since(db(srv), t0, 4)[0]
    assert (r.status, r.error_code, r.protocol, r.model, r.answered_by, r.provider) == (
        404,
        "model_not_found",
        "ollama",
        "no-such-model",
        None,
        None,
    )

    four = read_records(db(srv), limit=None, status=(400, 499))
    assert [x.status for x in four[:4]] == [404, 413, 403, 401]


def test_a_request_refused_by_the_rate_limiter_is_recorded(srv: Served) -> None:
    # a named key at 1 rpm holds one request (a bucket of ten seconds' worth, at least 1): its
    # second within the minute is refused at the edge, before the handler runs
    keys = KeyStore(srv.home / "config" / "keys.json")
    keys.add("slow", "k-slow-0123456789", rpm=1)
    slow = {"Authorization": "Bearer k-slow-0123456789"}
    try:
        t0 = time.time()
        conn = http.client.HTTPConnection("127.0.0.1", port(srv), timeout=DEADLINE)
        conn.request("GET", "/v1/models", headers=slow)
        first = conn.getresponse()
        first.read()
        assert first.status == 200
        conn.request("GET", "/v1/models", headers=slow)
        second = conn.getresponse()
        second.read()
        assert second.status == 429 and second.getheader("Retry-After")
        r, admitted = records_since(db(srv), t0, 2)[:2]
        assert (r.status, r.error_code, r.key, r.route, r.method) == (
            429,
            "rate_limit_exceeded",
            "slow",
            "/v1/models",
            "GET",
        )
        assert admitted.key == "slow"  # the admitted one, named too
        assert read_records(db(srv), limit=1, status=status_range("429")) == [r]
    finally:
        keys.remove("slow")


def test_records_survive_a_restart_and_content_is_kept_only_when_turned_on(srv: Served) -> None:
    ctl = srv.controller
    store = ctl.settings_store  # type: ignore[attr-defined]
    srv.call(ctl.stop("restart"), 30)  # type: ignore[attr-defined]
    before = read_records(db(srv), limit=None)  # stopping wrote every record
    assert before, "the earlier tests left records"
    store.update(records=replace(RecordSettings(), log_content=True, content_max_chars=40))
    try:
        srv.call(ctl.start("127.0.0.1", 0), 30)  # type: ignore[attr-defined]
        status, body = post(
            srv, "/v1/chat/completions", chat(srv, "Tell me a story " * 20, 8, False)
        )
        assert status == 200
        after = records_once(db(srv), len(before) + 1)
        assert after[1:] == before, "every record from before the restart is still there"
        rec = after[0]
        assert rec.request_text is not None and len(rec.request_text) == 40
        assert rec.request_text.startswith("{")
        answer = json.loads(body)["choices"][0]["message"]["content"]
        assert rec.response_text == answer[:40] and rec.response_text
        assert "request_text" not in rec.as_json() and "response_text" not in rec.as_json()
    finally:
        store.update(records=RecordSettings())


def test_a_client_that_goes_away_mid_stream_is_recorded_as_cancelled(srv: Served) -> None:
    t0 = time.time()
    # greedy SmolLM2 repeats "cat," far past the moment the client leaves, on any machine
    body = chat(srv, "The list: cat, cat, cat, cat, cat,", 1000, True)
    conn = http.client.HTTPConnection("127.0.0.1", port(srv), timeout=DEADLINE)
    conn.request("POST", "/v1/chat/completions", json.dumps(body), AUTH)
    r = conn.getresponse()
    assert r.status == 200 and r.read(1) == b"d"
    conn.sock.close()  # type: ignore[union-attr]
    conn.close()
    rec = records_since(db(srv), t0, 1)[0]
    assert (rec.status, rec.error_code, rec.stream) == (499, "cancelled", True)
    assert rec.ttft_ms is not None and rec.ttft_ms > 0
    assert (rec.model, rec.answered_by) == (srv.model_id, srv.model_id)
