"""`hearth load` with other options than the loaded ones reloads the model (drift:
it printed "loaded ... (context 2048)", exited 0 and kept the old options).

Against a real `hearth serve` child on SmolLM2. The stream that keeps the model busy is held
open by the test: it asks for thousands of tokens with the end-of-text tokens banned and ends
only when the test closes the connection (a disconnect cancels it within a token)."""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.serveproc import ServeProc, start_serve

pytestmark = pytest.mark.model

DEADLINE = 120.0  # generous: liveness, never speed
KEYS = {"id", "action", "options", "context_length"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, smollm2_path: Path) -> Iterator[ServeProc]:
    s = start_serve(tmp_path_factory.mktemp("reload"), smollm2_path)
    yield s
    s.stop()


def _env(s: ServeProc) -> dict[str, str]:
    env = {**os.environ, "HEARTH_HOME": str(s.home)}
    env.pop("HEARTH_API_KEY", None)
    return env


def hearth(s: ServeProc, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "app", *args],
        capture_output=True,
        text=True,
        env=_env(s),
        timeout=DEADLINE,
    )


def load_json(s: ServeProc, *args: str) -> dict[str, Any]:
    r = hearth(s, "load", *args, "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert set(out) == KEYS, out
    return out


def ps(s: ServeProc) -> dict[str, Any]:
    r = hearth(s, "ps", "--json")
    assert r.returncode == 0, r.stderr
    (entry,) = json.loads(r.stdout)
    return entry


class HeldStream:
    """A streamed completion that runs until ``close()`` (or thousands of tokens later)."""

    def __init__(self, s: ServeProc, model: str) -> None:
        port = int(s.root.rsplit(":", 1)[1])
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=DEADLINE)
        body = {
            "model": model,
            "prompt": "Once upon a time",
            "max_tokens": 7000,
            "stream": True,
            "temperature": 1.0,
            "seed": 1,
            # <|endoftext|>, <|im_start|>, <|im_end|>: the model cannot end it on its own
            "logit_bias": {"0": -100, "1": -100, "2": -100},
        }
        self.conn.request(
            "POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"}
        )
        self.resp = self.conn.getresponse()
        assert self.resp.status == 200

    def next_text(self) -> str:
        """The next event's text (an error event or the end fails the test)."""
        while True:
            line = self.resp.readline()
            assert line, "the stream ended"
            if not line.startswith(b"data: "):
                continue
            data = line[6:].strip()
            assert data != b"[DONE]", "the stream ended"
            event = json.loads(data)
            assert "error" not in event, event
            return str(event["choices"][0].get("text") or "")

    def close(self) -> None:
        self.conn.close()


def test_load_reloads_with_other_options_and_says_so(server: ServeProc) -> None:
    mid = next(iter(server.models.values()))
    first = load_json(server, mid)
    assert first["action"] == "loaded" and first["context_length"] == 2048  # the settings' default
    # the drift: this kept the old options and said "loaded ... (context 2048)"
    new = load_json(server, mid, "--parallel", "2", "--ctx", "1024")
    assert new["action"] == "reloaded" and new["context_length"] == 1024
    assert (new["options"]["parallel"], new["options"]["context_length"]) == (2, 1024)
    entry = ps(server)
    assert entry["context_length"] == 1024 and entry["options"]["parallel"] == 2
    assert load_json(server, mid, "--parallel", "2", "--ctx", "1024")["action"] == "unchanged"
    # options not given resolve as a fresh load would (defaults: parallel 8, context 2048)
    back = load_json(server, mid)
    assert back["action"] == "reloaded" and back["context_length"] == 2048
    assert back["options"]["parallel"] == 8
    # plain output names the action too
    r = hearth(server, "load", mid)
    assert r.returncode == 0 and r.stdout.strip() == f"unchanged {mid} (context 2048)"
    assert server.alive()


def test_reload_while_a_stream_runs_is_refused_then_waits_with_wait(server: ServeProc) -> None:
    mid = next(iter(server.models.values()))
    assert load_json(server, mid, "--ctx", "8192")["context_length"] == 8192
    stream = HeldStream(server, mid)
    waiter: subprocess.Popen[str] | None = None
    try:
        while not stream.next_text():
            pass  # the role-less first events
        r = hearth(server, "load", mid, "--ctx", "4096", "--json")
        assert r.returncode == 1 and r.stdout == ""
        assert "running on it" in r.stderr and "--wait" in r.stderr, r.stderr
        st, body = server.post(
            "/api/v1/models/load", {"model": mid, "options": {"context_length": 4096}}
        )
        assert st == 409 and body["error"]["code"] == "model_busy", body
        stream.next_text()  # the refusal cut nothing
        assert ps(server)["context_length"] == 8192

        waiter = subprocess.Popen(
            [sys.executable, "-m", "app", "load", mid, "--ctx", "4096", "--wait", "--json"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_env(server),
        )
        deadline = time.monotonic() + DEADLINE
        # the gate: the server says the reload waits
        while not server.get("/api/v1/ps")[1]["models"][0]["reload_pending"]:
            assert waiter.poll() is None, waiter.communicate()
            assert time.monotonic() < deadline, "the reload never started waiting"
        stream.next_text()  # still streaming: the waiting reload cut nothing
        assert waiter.poll() is None and ps(server)["context_length"] == 8192
    finally:
        stream.close()  # the stream ends here; the waiting reload goes on
    assert waiter is not None
    out, err = waiter.communicate(timeout=DEADLINE)
    assert waiter.returncode == 0, err
    done = json.loads(out)
    assert set(done) == KEYS and done["action"] == "reloaded" and done["context_length"] == 4096
    entry = ps(server)
    assert entry["context_length"] == 4096 and entry["reload_pending"] is False
    assert server.alive()
