"""SECURITY.md 6 on the real server: clients that dribble headers or bodies are closed by their
deadlines and capped per address, while whole requests (keep-alive, large bodies, streams)
are served throughout.

The slow clients connect from 127.0.0.2/127.0.0.3 (the whole of 127/8 is loopback on Linux) so
their caps are not the test's own 127.0.0.1. Deadlines are set short through the settings.
"""

from __future__ import annotations

import http.client
import json
import selectors
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Served, start_served, stop_served

HEADER_S = 2.0
BODY_S = 2.0
MIN_RATE = 64 * 1024
PROMPT_S = 1.0  # the liveness deadline for a normal request during the storm (not a speed claim)


def _source(address: str) -> str:
    try:
        with socket.socket() as s:
            s.bind((address, 0))
    except OSError:
        pytest.skip(f"{address} is not a local address here (only Linux has all of 127/8)")
    return address


def _connect(port: int, source: str) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=30, source_address=(source, 0))


def _read_response(sock: socket.socket) -> tuple[int, bytes]:
    """One whole response (Content-Length framed) from a keep-alive socket."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed before a response: {buf!r}")
        buf += chunk
    head, _, body = buf.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed mid-body")
        body += chunk
    return int(head.split(b" ", 2)[1]), body[:length]


def _estimate(model_id: str, pad: int = 0) -> bytes:
    return json.dumps({"model": model_id, "options": {}, "padding": "x" * pad}).encode()


def _post_head(path: str, length: int) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {length}\r\n\r\n"
    ).encode()


@pytest.fixture(scope="module")
def edge(tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path) -> Iterator[Served]:
    s = start_served(
        tmp_path_factory.mktemp("edge"),
        smollm2_path,
        header_timeout_s=HEADER_S,
        body_timeout_s=BODY_S,
        body_min_rate=MIN_RATE,
        max_incomplete_connections=1000,
        max_incomplete_per_client=400,
    )
    yield s
    stop_served(s)


class _Prober(threading.Thread):
    """Normal requests from 127.0.0.1, one after another, until told to stop."""

    def __init__(self, s: Served) -> None:
        super().__init__(daemon=True)
        self.s = s
        self.stop = threading.Event()
        self.samples: list[tuple[str, int, float]] = []
        self.errors: list[BaseException] = []

    def run(self) -> None:
        body = _estimate(self.s.model_id)
        while not self.stop.is_set():
            for method, path in (
                ("GET", "/health"),
                ("GET", "/v1/models"),
                ("POST", "/api/v1/models/estimate"),
            ):
                t0 = time.monotonic()
                try:
                    conn = http.client.HTTPConnection("127.0.0.1", self.s.port, timeout=30)
                    conn.request(method, path, body=body if method == "POST" else None)
                    r = conn.getresponse()
                    r.read()
                    conn.close()
                except BaseException as e:  # noqa: BLE001 - asserted by the test
                    self.errors.append(e)
                    return
                self.samples.append((path, r.status, time.monotonic() - t0))
            self.stop.wait(0.1)


@pytest.mark.model
def test_dribbling_clients_are_closed_by_deadlines_and_health_answers_meanwhile(
    edge: Served,
) -> None:
    src = _source("127.0.0.2")
    sel = selectors.DefaultSelector()
    started: dict[socket.socket, float] = {}  # when its first byte (or connect) was sent
    kind: dict[socket.socket, str] = {}
    got: dict[socket.socket, bytes] = {}
    closed: dict[socket.socket, float] = {}
    reset: set[socket.socket] = set()
    prober = _Prober(edge)
    prober.start()
    try:
        for i in range(260):
            c = _connect(edge.port, src)
            started[c] = time.monotonic()
            if i < 200:  # headers, one line at a time
                kind[c] = "headers"
                c.sendall(b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            elif i < 250:  # a body announced, one byte sent
                kind[c] = "body"
                c.sendall(_post_head("/v1/chat/completions", 100_000) + b"{")
            else:  # connected, nothing sent
                kind[c] = "silent"
            c.setblocking(False)
            got[c] = b""
            sel.register(c, selectors.EVENT_READ)
        deadline = time.monotonic() + 60  # generous: they are due after ~2 s
        next_drip = time.monotonic()
        line = 0
        while len(closed) < len(started) and time.monotonic() < deadline:
            if time.monotonic() >= next_drip:
                line += 1
                for c, k in kind.items():
                    if k == "headers" and c not in closed:
                        try:
                            c.send(f"X-Drip-{line}: x\r\n".encode())
                        except OSError:
                            pass  # closed by the server: its EOF is read below
                next_drip = time.monotonic() + 0.5
            for key, _ in sel.select(timeout=0.1):
                c = key.fileobj  # type: ignore[assignment]
                try:
                    data = c.recv(65536)
                except ConnectionResetError:  # a drip crossed the server's close
                    reset.add(c)
                    data = b""
                if data:
                    got[c] += data
                    continue
                closed[c] = time.monotonic()
                sel.unregister(c)
    finally:
        prober.stop.set()
        prober.join(60)
        for c in started:
            c.close()
        sel.close()
    open_left = [kind[c] for c in started if c not in closed]
    assert not open_left, f"{len(open_left)} slow connections still open: {set(open_left)}"
    for c, t in closed.items():
        # closed by its deadline (never before it: timers do not fire early)
        assert t - started[c] >= min(HEADER_S, BODY_S) - 0.05, kind[c]
        if kind[c] == "headers":
            if c in reset and not got[c]:
                continue  # the 408 may be lost to the reset a late drip caused
            assert got[c].startswith(b"HTTP/1.1 408 "), got[c][:80]
            err = json.loads(got[c].partition(b"\r\n\r\n")[2])["error"]
            assert err["code"] == "request_timeout"
        else:
            assert got[c] == b"", (kind[c], got[c][:80])  # no response: just closed
    assert not prober.errors, prober.errors
    assert len(prober.samples) >= 3, "the normal requests ran during the storm"
    for path, status, secs in prober.samples:
        assert status == 200, (path, status)
        assert secs < PROMPT_S, f"{path} took {secs:.2f}s during the storm"


@pytest.mark.model
def test_keep_alive_idle_between_requests_is_not_a_slow_client(edge: Served) -> None:
    with socket.create_connection(("127.0.0.1", edge.port), timeout=30) as c:
        for i in range(3):
            c.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            status, _ = _read_response(c)
            assert status == 200, i
            if i < 2:  # idle past both deadlines: keep-alive, not a request being sent
                time.sleep(2 * max(HEADER_S, BODY_S))


@pytest.mark.model
def test_large_bodies_sent_promptly_or_at_the_minimum_rate_are_served(edge: Served) -> None:
    big = _estimate(edge.model_id, pad=8 * 1024 * 1024)  # at once: a fraction of the deadline
    with socket.create_connection(("127.0.0.1", edge.port), timeout=60) as c:
        c.sendall(_post_head("/api/v1/models/estimate", len(big)) + big)
        status, body = _read_response(c)
        assert status == 200, body[:200]
        # longer than body_timeout_s in all, but each second well above the minimum rate:
        # the deadline moves with the bytes received
        paced = _estimate(edge.model_id, pad=768 * 1024)
        c.sendall(_post_head("/api/v1/models/estimate", len(paced)))
        step = 32 * 1024  # every 0.1 s: 320 KiB/s, five times MIN_RATE
        t0 = time.monotonic()
        for i in range(0, len(paced), step):
            c.sendall(paced[i : i + step])
            time.sleep(0.1)
        assert time.monotonic() - t0 > BODY_S
        status, body = _read_response(c)
        assert status == 200, body[:200]


@pytest.mark.model
def test_a_stream_answering_longer_than_the_deadlines_is_not_cut(edge: Served) -> None:
    body = json.dumps(
        {"model": edge.model_id, "prompt": "Once upon a time", "max_tokens": 16, "stream": True}
    ).encode()
    with socket.create_connection(("127.0.0.1", edge.port), timeout=120) as c:
        c.sendall(_post_head("/v1/completions", len(body)) + body)
        buf = b""
        while b"data: " not in buf:
            buf += c.recv(65536)
        time.sleep(2 * max(HEADER_S, BODY_S))  # the answer is ours to read slowly
        while b"data: [DONE]" not in buf:
            chunk = c.recv(65536)
            assert chunk, f"the stream was cut: {buf[-200:]!r}"
            buf += chunk


@pytest.mark.model
def test_caps_refuse_only_new_incomplete_connections(tmp_path: Path, smollm2_path: Path) -> None:
    """Per client 5, in all 8. Over the cap a connection that is still sending is refused
    (503, closed); whole requests from the same address are always served."""
    a, b = _source("127.0.0.2"), _source("127.0.0.3")
    s = start_served(
        tmp_path / "caps",
        smollm2_path,
        header_timeout_s=120.0,  # the caps close these, never the deadlines
        body_timeout_s=120.0,
        max_incomplete_per_client=5,
        max_incomplete_connections=8,
    )
    est = _estimate(s.model_id)
    socks: list[socket.socket] = []
    try:

        def partial(src: str, kind: str) -> socket.socket:
            c = _connect(s.port, src)
            socks.append(c)
            if kind == "headers":
                c.sendall(b"POST /api/v1/models/estimate HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            else:
                c.sendall(_post_head("/api/v1/models/estimate", len(est)) + est[:5])
            return c

        def finish(c: socket.socket, kind: str) -> int:
            if kind == "headers":
                c.sendall(
                    f"Content-Length: {len(est)}\r\nContent-Type: application/json\r\n\r\n".encode()
                    + est
                )
            else:
                c.sendall(est[5:])
            return _read_response(c)[0]

        def whole(src: str) -> int:
            with _connect(s.port, src) as c:
                c.sendall(_post_head("/api/v1/models/estimate", len(est)) + est)
                return _read_response(c)[0]

        def refused(cs: list[socket.socket], n: int) -> list[socket.socket]:
            """Wait for ``n`` of ``cs`` to be closed by the server (each after a 503)."""
            done: list[socket.socket] = []
            sel = selectors.DefaultSelector()
            for c in cs:
                sel.register(c, selectors.EVENT_READ)
            end = time.monotonic() + 30
            while len(done) < n and time.monotonic() < end:
                for key, _ in sel.select(timeout=0.2):
                    c = key.fileobj  # type: ignore[assignment]
                    data = b""
                    c.settimeout(10)
                    while chunk := c.recv(65536):
                        data += chunk
                    assert data.startswith(b"HTTP/1.1 503 "), data[:80]
                    assert json.loads(data.partition(b"\r\n\r\n")[2])["error"]["code"] == (
                        "too_many_incomplete_connections"
                    )
                    sel.unregister(c)
                    done.append(c)
            sel.close()
            assert len(done) == n, f"{len(done)} of {n} refused"
            return done

        kinds = ["headers", "body"] * 5
        first = [partial(a, k) for k in kinds]  # 10 from a: 5 over its cap
        gone = refused(first, 5)
        kept = [(c, k) for c, k in zip(first, kinds, strict=True) if c not in gone]
        assert whole(a) == 200, "a whole request from a capped address is still served"
        assert whole("127.0.0.1") == 200
        second = [partial(b, k) for k in ("headers", "body", "headers", "body")]
        refused(second, 1)  # 5 + 3 = 8 in all: the 4th from b is over the global cap
        assert whole(b) == 200
        for c, k in kept:  # the admitted ones were open all along and are answered
            assert finish(c, k) == 200
        # finished requests no longer count: the address may start 5 again
        again = [partial(a, k) for k in ("headers", "body", "headers", "body")]
        for c, k in zip(again, ("headers", "body", "headers", "body"), strict=True):
            assert finish(c, k) == 200
    finally:
        for c in socks:
            c.close()
        stop_served(s)


@pytest.mark.parametrize(
    ("peer", "key"),
    [
        (("127.0.0.2", 5000), "127.0.0.2"),
        (("::ffff:10.1.2.3", 5000, 0, 0), "10.1.2.3"),  # a dual-stack socket's IPv4 client
        (("2001:db8:1:2:aaaa::1", 5000, 0, 0), "2001:db8:1:2::/64"),
        (("2001:db8:1:2:bbbb::9", 5000, 0, 0), "2001:db8:1:2::/64"),  # same host, same cap
        (("::1", 5000, 0, 0), "::1"),
        (("fe80::1%eth0", 5000, 0, 2), "fe80::/64"),
    ],
)
def test_client_key_groups_an_ipv6_host_by_its_64(peer: tuple, key: str) -> None:
    from app.server.edge.connections import client_key

    assert client_key(peer) == key


def test_incomplete_counter_caps_and_releases() -> None:
    from app.server.edge.connections import EdgeLimits, IncompleteConnections

    c = IncompleteConnections(EdgeLimits(max_incomplete=3, max_incomplete_per_client=2))
    assert c.admit("a") and c.admit("a") and not c.admit("a")  # per client
    assert c.admit("b") and not c.admit("c")  # in all
    c.release("a")
    assert c.admit("c") and not c.admit("a")
    for k in ("a", "b", "c"):
        c.release(k)
    assert (c.total, c.by_client) == (0, {})
