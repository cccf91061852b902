"""SECURITY.md 1-5, 11 and 13 on the real server: allow-lists, keys, body limits and encodings,
bind decisions, queue, shutdown."""

from __future__ import annotations

import gzip
import http.client
import json
import socket
import threading
import time
from pathlib import Path

import openai
import pytest

from app.core.events import ModelLoading
from tests.conftest import Served, start_served, stop_served

pytestmark = pytest.mark.model

MSG = [{"role": "user", "content": "Hi"}]


def raw_request(port: int, raw: bytes, timeout: float = 30) -> tuple[int, bytes]:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(raw)
        buf = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            buf += chunk
            if b"\r\n\r\n" in buf:
                head, _, body = buf.partition(b"\r\n\r\n")
                length = [
                    int(h.split(b":")[1])
                    for h in head.split(b"\r\n")
                    if h.lower().startswith(b"content-length:")
                ]
                if length and len(body) >= length[0]:
                    break
    status = int(buf.split(b" ", 2)[1])
    return status, buf


def request(
    port: int, method: str, path: str, headers: dict[str, str], body: bytes = b""
) -> tuple[int, dict[str, str], bytes]:
    lines = [f"{method} {path} HTTP/1.1"] + [f"{k}: {v}" for k, v in headers.items()]
    if body or method == "POST":
        lines.append(f"Content-Length: {len(body)}")
    lines.append("Connection: close")
    raw = ("\r\n".join(lines) + "\r\n\r\n").encode() + body
    status, buf = raw_request(port, raw)
    head, _, payload = buf.partition(b"\r\n\r\n")
    hdrs = {}
    for line in head.split(b"\r\n")[1:]:
        k, _, v = line.decode().partition(":")
        hdrs[k.strip().lower()] = v.strip()
    return status, hdrs, payload


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path):  # type: ignore[no-untyped-def]
    s = start_served(
        tmp_path_factory.mktemp("sec"), smollm2_path, queue_size=1, max_body_bytes=64 * 1024
    )
    yield s
    stop_served(s)


@pytest.mark.parametrize(
    "host",
    [
        "",
        ":8421",
        "localhost.evil.com",
        "evil.localhost.com",
        "evil.com",
        "127.0.0.1.nip.io",
        "LOCALHOST.evil.com",
        "[::1].evil.com",
        "localhost:abc",
        "0.0.0.0",
    ],
)
def test_bad_host_403_before_anything_happens(plain: Served, host: str) -> None:
    events: list[object] = []
    unsub = plain.service.events.subscribe(events.append)  # type: ignore[attr-defined]
    try:
        body = json.dumps({"model": plain.model_id, "messages": MSG}).encode()
        status, _, payload = request(
            plain.port,
            "POST",
            "/v1/chat/completions",
            {"Host": host, "Content-Type": "application/json"},
            body,
        )
    finally:
        unsub()
    assert status == 403
    assert json.loads(payload)["error"]["code"] == "forbidden"
    assert not any(isinstance(e, ModelLoading) for e in events), (
        "a refused request must not load a model"
    )


@pytest.mark.parametrize(
    "host", ["localhost", "LocalHost:1234", "127.0.0.1", "127.0.0.1:8421", "[::1]", "[::1]:8421"]
)
def test_loopback_hosts_allowed(plain: Served, host: str) -> None:
    status, _, _ = request(plain.port, "GET", "/health", {"Host": host})
    assert status == 200


def test_missing_host_header_403(plain: Served) -> None:
    status, _ = raw_request(plain.port, b"GET /v1/models HTTP/1.0\r\n\r\n")
    assert status == 403


@pytest.mark.parametrize("method", ["GET", "POST", "OPTIONS", "DELETE"])
def test_foreign_origin_403_every_method(plain: Served, method: str) -> None:
    headers = {"Host": "127.0.0.1", "Origin": "https://evil.example"}
    body = b""
    if method == "POST":  # a "simple" CORS request: text/plain needs no preflight
        headers["Content-Type"] = "text/plain"
        body = json.dumps({"model": plain.model_id, "messages": MSG}).encode()
    status, hdrs, _ = request(
        plain.port,
        method,
        "/v1/chat/completions" if method != "GET" else "/v1/models",
        headers,
        body,
    )
    assert status == 403
    assert "access-control-allow-origin" not in hdrs


def test_local_origin_echoed_exactly(plain: Served) -> None:
    origin = "http://localhost:3000"
    status, hdrs, _ = request(
        plain.port, "GET", "/v1/models", {"Host": "127.0.0.1", "Origin": origin}
    )
    assert status == 200
    assert hdrs["access-control-allow-origin"] == origin
    status, hdrs, _ = request(
        plain.port,
        "OPTIONS",
        "/v1/chat/completions",
        {
            "Host": "127.0.0.1",
            "Origin": origin,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type",
        },
    )
    assert status == 204 and hdrs["access-control-allow-origin"] == origin
    assert "*" not in hdrs["access-control-allow-origin"]


def test_body_over_limit_413_then_next_ok(plain: Served) -> None:
    big = json.dumps(
        {"model": plain.model_id, "messages": [{"role": "user", "content": "x" * 200_000}]}
    ).encode()
    status, _, payload = request(
        plain.port,
        "POST",
        "/v1/chat/completions",
        {"Host": "127.0.0.1", "Content-Type": "application/json"},
        big,
    )
    assert status == 413
    assert json.loads(payload)["error"]["code"] == "request_too_large"
    status, _, _ = request(plain.port, "GET", "/health", {"Host": "127.0.0.1"})
    assert status == 200


def test_gzip_bomb_bounded_after_decompression(plain: Served) -> None:
    inner = json.dumps(
        {"model": plain.model_id, "messages": [{"role": "user", "content": "a" * 5_000_000}]}
    ).encode()
    bomb = gzip.compress(inner)
    assert len(bomb) < 64 * 1024  # small on the wire, huge inside
    status, _, _ = request(
        plain.port,
        "POST",
        "/v1/chat/completions",
        {"Host": "127.0.0.1", "Content-Type": "application/json", "Content-Encoding": "gzip"},
        bomb,
    )
    assert status == 413


@pytest.mark.parametrize(
    "origin",
    [
        "http://[::1].evil.com",
        "http://[::1]evil.com",
        "http://[127.0.0.1]",
        "http://[::1",
        "http://localhost, http://evil.com",
        "http://localhost,http://evil.com",
        "http://localhost http://evil.com",
        "http://localhost/",
        "http://localhost:3000/path",
        "http://localhost?x=1",
        "http://localhost#frag",
        "http://user@localhost",
        "http://evil.com@localhost",
        "http://localhost:0",
        "http://localhost:99999",
        "http://localhost:",
        "http://127.0.0.1.evil.com",
        "http://localhost.evil.com",
        "http://127.1",
        "ftp://localhost",
        "null",
        "",
        "localhost",
        "//localhost",
        "http://",
        "http://[fe80::1%25eth0]",
    ],
)
def test_malformed_or_smuggled_origin_403_never_echoed(plain: Served, origin: str) -> None:
    status, hdrs, payload = request(
        plain.port, "GET", "/v1/models", {"Host": "127.0.0.1", "Origin": origin}
    )
    assert status == 403, origin
    assert "access-control-allow-origin" not in hdrs
    assert json.loads(payload)["error"]["code"] == "forbidden"


def test_two_origin_headers_403(plain: Served) -> None:
    raw = (
        b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nOrigin: http://localhost\r\n"
        b"Origin: http://evil.com\r\nConnection: close\r\n\r\n"
    )
    status, buf = raw_request(plain.port, raw)
    assert status == 403 and b"access-control-allow-origin" not in buf.lower()


@pytest.mark.parametrize(
    "origin",
    ["http://localhost", "https://127.0.0.1:8443", "http://[::1]:5173", "HTTP://LOCALHOST"],
)
def test_loopback_origins_allowed_and_echoed(plain: Served, origin: str) -> None:
    status, hdrs, _ = request(
        plain.port, "GET", "/v1/models", {"Host": "127.0.0.1", "Origin": origin}
    )
    assert status == 200 and hdrs["access-control-allow-origin"] == origin


def _post_encoded(plain: Served, path: str, body: bytes, encoding: str) -> tuple[int, dict]:
    status, _, payload = request(
        plain.port,
        "POST",
        path,
        {"Host": "127.0.0.1", "Content-Type": "application/json", "Content-Encoding": encoding},
        body,
    )
    return status, json.loads(payload)


def _estimate_body(plain: Served) -> bytes:
    return json.dumps({"model": plain.model_id, "options": {"context_length": 512}}).encode()


def test_gzip_and_deflate_bodies_are_decoded(plain: Served) -> None:
    import zlib

    raw = _estimate_body(plain)
    for body, enc in (
        (gzip.compress(raw), "gzip"),
        (gzip.compress(raw[:20]) + gzip.compress(raw[20:]), "gzip"),  # two members (RFC 1952)
        (zlib.compress(raw), "deflate"),
        (zlib.compress(raw)[2:-4], "deflate"),  # raw deflate, as some clients send it
        (raw, "identity"),
    ):
        status, out = _post_encoded(plain, "/api/v1/models/estimate", body, enc)
        assert status == 200, (enc, out)
        assert out["id"] == plain.model_id


@pytest.mark.parametrize(
    ("name", "make", "words"),
    [
        ("not gzip", lambda raw: raw, "not valid gzip"),
        ("garbage", lambda raw: b"\x1f\x8b\x08" + b"\xff" * 40, "not valid gzip"),
        ("truncated", lambda raw: gzip.compress(raw)[:-12], "truncated"),
        ("no trailer", lambda raw: gzip.compress(raw)[:-8], "truncated"),
        ("trailing junk", lambda raw: gzip.compress(raw) + b"junk", "not valid gzip"),
    ],
)
def test_bad_gzip_body_400_naming_the_problem(plain: Served, name: str, make, words: str) -> None:  # type: ignore[no-untyped-def]
    body = make(_estimate_body(plain))
    status, out = _post_encoded(plain, "/api/v1/models/estimate", body, "gzip")
    assert status == 400, (name, out)
    assert out["error"]["type"] == "invalid_request_error"
    assert words in out["error"]["message"], out
    # Ollama routes keep their own shape
    status, out = _post_encoded(plain, "/api/show", body, "gzip")
    assert status == 400 and words in out["error"], out
    status, _, _ = request(plain.port, "GET", "/health", {"Host": "127.0.0.1"})
    assert status == 200


def test_unknown_or_stacked_encoding_415(plain: Served) -> None:
    raw = _estimate_body(plain)
    for enc in ("br", "compress", "gzip, gzip"):
        status, out = _post_encoded(plain, "/api/v1/models/estimate", raw, enc)
        assert status == 415, (enc, out)
        assert out["error"]["code"] == "unsupported_content_encoding"


def test_queue_full_429_with_retry_after_and_running_stream_not_cut(plain: Served) -> None:
    """queue_size=1: one running + one waiting; the third is refused at once; nobody is cut.

    The running stream must outlast the test's next steps on any machine: greedy SmolLM2
    repeats "cat," without end, so it runs its full 1,000 tokens (seconds even at twice this
    machine's speed), and the waiting one is seen in /api/v1/ps before the third is sent."""
    results: dict[str, object] = {}

    def stream(name: str, prompt: str, max_tokens: int) -> None:
        c = openai.OpenAI(base_url=plain.base_url, api_key="x", max_retries=0, timeout=250)
        chunks = list(
            c.completions.create(
                model=plain.model_id,
                prompt=prompt,
                max_tokens=max_tokens,
                temperature=0,
                stream=True,
            )
        )
        results[name] = chunks[-1].choices[0].finish_reason

    def pending() -> int:
        conn = http.client.HTTPConnection("127.0.0.1", plain.port, timeout=10)
        conn.request("GET", "/api/v1/ps")
        ps = json.loads(conn.getresponse().read())
        return int(ps["models"][0]["pending_requests"]) if ps["models"] else 0

    def wait_pending(n: int) -> None:
        deadline = time.monotonic() + 60
        while pending() < n:
            assert time.monotonic() < deadline, f"never {n} pending"
            time.sleep(0.01)

    def post(path: str, body: dict) -> int:
        conn = http.client.HTTPConnection("127.0.0.1", plain.port, timeout=120)
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        status = conn.getresponse().status
        conn.close()
        return status

    # one sequence at a time: with the default parallel (8) the second runs beside the first
    # as soon as the worker admits it, and the third may find the queue empty (it did)
    load = {"model": plain.model_id, "options": {"parallel": 1}}
    assert post("/api/v1/models/load", load) == 200
    cats = "The list: cat, cat, cat, cat, cat,"
    t1 = threading.Thread(target=stream, args=("first", cats, 1000))
    t1.start()
    wait_pending(1)
    t2 = threading.Thread(target=stream, args=("second", "Once upon a time", 20))
    t2.start()
    wait_pending(2)
    t0 = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", plain.port, timeout=30)
    conn.request(
        "POST",
        "/v1/completions",
        body=json.dumps({"model": plain.model_id, "prompt": "x", "max_tokens": 2}),
        headers={"Content-Type": "application/json"},
    )
    r = conn.getresponse()
    payload = r.read()
    assert r.status == 429, payload
    assert int(r.getheader("Retry-After")) >= 1
    assert json.loads(payload)["error"]["code"] == "queue_full"
    assert time.monotonic() - t0 < 2, "queue-full must answer at once"
    t1.join(250)
    t2.join(250)
    assert results == {"first": "length", "second": "length"} or set(results.values()) <= {
        "stop",
        "length",
    }
    assert set(results) == {"first", "second"}
    assert post("/api/v1/models/unload", {"model": plain.model_id}) == 200


def test_jit_concurrent_requests_load_once(tmp_path: Path, smollm2_path: Path) -> None:
    s = start_served(tmp_path / "jit", smollm2_path)
    try:
        events: list[object] = []
        s.service.events.subscribe(events.append)  # type: ignore[attr-defined]
        c = openai.OpenAI(base_url=s.base_url, api_key="x", max_retries=0, timeout=120)
        errors: list[BaseException] = []

        def one() -> None:
            try:
                c.completions.create(model=s.model_id, prompt="Hi", max_tokens=2)
            except BaseException as e:  # noqa: BLE001 - collected and asserted below
                errors.append(e)

        threads = [threading.Thread(target=one) for _ in range(5)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not errors
        assert sum(isinstance(e, ModelLoading) for e in events) == 1
    finally:
        stop_served(s)


def test_api_key_required_everywhere_but_health(tmp_path: Path, smollm2_path: Path) -> None:
    key = "sk-test-0123456789"
    s = start_served(tmp_path / "keyed", smollm2_path, api_key=key)
    try:
        for method, path in [
            ("GET", "/v1/models"),
            ("GET", f"/v1/models/{s.model_id}"),
            ("POST", "/v1/chat/completions"),
            ("POST", "/v1/completions"),
            ("GET", "/api/v1/models"),
            ("GET", "/api/v1/ps"),
            ("GET", "/nope"),
        ]:
            for auth in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": key}):
                status, hdrs, payload = request(
                    s.port,
                    method,
                    path,
                    {"Host": "127.0.0.1", **auth},
                    b"{}" if method == "POST" else b"",
                )
                assert status == 401, (method, path, auth)
                assert json.loads(payload)["error"]["code"] == "invalid_api_key"
        status, _, _ = request(s.port, "GET", "/health", {"Host": "127.0.0.1"})
        assert status == 200
        good = openai.OpenAI(base_url=s.base_url, api_key=key, max_retries=0)
        assert s.model_id in [m.id for m in good.models.list().data]
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=s.base_url, api_key="bad", max_retries=0).models.list()
        # the key is never written anywhere in clear
        for f in s.home.rglob("*"):
            if f.is_file() and f.stat().st_size < 10_000_000:
                assert key.encode() not in f.read_bytes(), f
    finally:
        stop_served(s)


def test_lan_bind_without_key_refused(tmp_path: Path, smollm2_path: Path) -> None:
    from app.errors import ServerError

    s = start_served(tmp_path / "lan", smollm2_path)
    try:
        s.call(s.controller.stop())  # type: ignore[attr-defined]
        with pytest.raises(ServerError, match="API key"):
            s.call(s.controller.start("0.0.0.0", 0))  # type: ignore[attr-defined]
    finally:
        stop_served(s)


def _mapped(names: dict[str, str]):  # type: ignore[no-untyped-def]
    """A resolver that answers for ``names`` as /etc/hosts would, and as usual otherwise."""

    def resolve(host, port, *args, **kwargs):  # type: ignore[no-untyped-def]
        return socket.getaddrinfo(names.get(host, host), port, *args, **kwargs)

    return resolve


def test_name_resolving_to_a_wildcard_needs_a_key(tmp_path: Path, smollm2_path: Path) -> None:
    """``127.evil.example`` looks loopback but (in /etc/hosts here) is 0.0.0.0: the bound
    address decides, and nothing is left listening after the refusal."""
    from app.errors import ServerError

    s = start_served(tmp_path / "dns", smollm2_path)
    ctl = s.controller
    try:
        s.call(ctl.stop())  # type: ignore[attr-defined]
        ctl.resolve = _mapped(  # type: ignore[attr-defined]
            {"127.evil.example": "0.0.0.0", "127.six.example": "::", "hearth.test": "127.0.0.1"}
        )
        port = _free_port()
        for name in ("127.evil.example", "127.six.example"):
            with pytest.raises(ServerError, match="API key") as ei:
                s.call(ctl.start(name, port))  # type: ignore[attr-defined]
            assert name in ei.value.message
            assert not ctl.running  # type: ignore[attr-defined]
            with socket.socket() as probe:  # the port was let go: nothing listens there
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                probe.bind(("0.0.0.0", port))
        # a name that resolves to loopback starts without a key; the URL shows the address
        url = s.call(ctl.start("hearth.test", 0))  # type: ignore[attr-defined]
        assert url == f"http://127.0.0.1:{ctl.port}/v1"  # type: ignore[attr-defined]
        for host in ("127.0.0.1", "hearth.test"):
            status, _, _ = request(ctl.port, "GET", "/v1/models", {"Host": host})  # type: ignore[attr-defined]
            assert status == 200, host
        s.call(ctl.stop())  # type: ignore[attr-defined]
        # with a key the wildcard name is fine; the URL a local client uses is loopback
        ctl.set_api_key("k-1")  # type: ignore[attr-defined]
        url = s.call(ctl.start("127.evil.example", 0))  # type: ignore[attr-defined]
        assert url == f"http://127.0.0.1:{ctl.port}/v1"  # type: ignore[attr-defined]
        assert ctl.addresses == ("0.0.0.0",)  # type: ignore[attr-defined]
    finally:
        stop_served(s)


@pytest.mark.parametrize(
    ("address", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.255.0.9", True),
        ("::1", True),
        ("::ffff:127.0.0.1", True),
        ("0.0.0.0", False),
        ("::", False),
        ("192.168.1.20", False),
        ("::ffff:10.0.0.1", False),
        ("fe80::1%eth0", False),
        ("127.evil.example", False),
        ("localhost", False),  # a name, not a bound address
    ],
)
def test_is_loopback_address(address: str, loopback: bool) -> None:
    from app.server.runner import is_loopback_address

    assert is_loopback_address(address) is loopback


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_port_busy_is_clear_error(tmp_path: Path, smollm2_path: Path) -> None:
    from app.errors import ServerError

    s = start_served(tmp_path / "busy", smollm2_path)
    try:
        other = start_served(tmp_path / "busy2", smollm2_path)
        stop_served(other)
        ctl = other.controller
        from app.core.util.loop import LoopThread

        lt = LoopThread().start()
        try:
            with pytest.raises(ServerError, match="already in use"):
                lt.call(ctl.start("127.0.0.1", s.port), 30)  # type: ignore[attr-defined]
        finally:
            lt.stop()
    finally:
        stop_served(s)


def test_stop_with_active_stream_sends_final_error_event_and_frees_port(
    tmp_path: Path, smollm2_path: Path
) -> None:
    s = start_served(tmp_path / "quit", smollm2_path)
    port = s.port
    try:
        body = json.dumps(
            {
                "model": s.model_id,
                "prompt": "Once upon a time",
                "max_tokens": 3000,
                "stream": True,
                "temperature": 1.0,
                "seed": 5,
            }
        ).encode()
        sock = socket.create_connection(("127.0.0.1", port), timeout=60)
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body) + body
        )
        buf = b""
        while b"data: " not in buf:  # the stream is running
            buf += sock.recv(65536)
        s.call(s.controller.stop("quit"), 30)  # type: ignore[attr-defined]
        while chunk := sock.recv(65536):
            buf += chunk
        sock.close()
        events = [
            line[6:]
            for line in buf.decode(errors="replace").splitlines()
            if line.startswith("data: ")
        ]
        assert events, "the stream got no final event"
        assert "[DONE]" not in events, "a cut stream must not look complete"
        assert json.loads(events[-1])["error"]["code"] == "server_shutting_down"
        # the port can be bound again at once
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        sock.close()
        assert not (s.home / "data" / "server.json").exists()
    finally:
        stop_served(s)
