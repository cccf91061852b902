"""/health's ``state``: busy while every queue is full, shutting_down during a graceful
stop, starting while startup steps run, error when one failed.

A real ServerController (the aiohttp server on a loopback port) over the real Worker, with a
scripted engine whose gates the test holds (tests/support/fakes.py); no sleeps.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from app.core.library.index import ModelLibrary
from app.core.service import Hearth, assemble
from app.core.types import LoadOptions
from app.core.util.loop import LoopThread
from app.errors import HearthError
from app.paths import AppPaths
from app.server.runner import ServerController
from app.settings import SettingsStore
from tests.conftest import write_settings
from tests.support.fakes import FakeRuntime
from tests.support.gguf_files import write_model

DEADLINE = 60.0  # liveness only


@dataclass
class Fake:
    port: int
    model_id: str
    runtime: FakeRuntime
    service: Hearth
    loop: LoopThread
    controller: ServerController


@contextlib.contextmanager
def fake_served(tmp_path: Path, *, starting: bool = False, **runtime: Any) -> Iterator[Fake]:
    home = tmp_path / "home"
    write_settings(home, port=0)
    paths = AppPaths.default(home).ensure()
    lib = ModelLibrary(tmp_path / "lib.json", tmp_path / "models")
    lib.import_path(write_model(tmp_path / "src" / "tiny.gguf"))
    (model,) = lib.list()
    lib.import_path(write_model(tmp_path / "src" / "spare.gguf", name="Spare"))
    rt = FakeRuntime(delay=0.0, **runtime)
    service = assemble(lib, {"gguf": rt}, load_defaults=LoadOptions)
    loop = LoopThread().start()
    ctl = ServerController(service, SettingsStore(paths.settings_file), paths)
    loop.call(ctl.start("127.0.0.1", 0, starting=starting), 30)
    assert ctl.port is not None
    try:
        yield Fake(ctl.port, model.id, rt, service, loop, ctl)
    finally:
        rt.load_gate.set()
        for m in rt.models:
            m.engine.gate.set()
        loop.call(ctl.stop("test"), 30)
        loop.call(service.close(), 30)
        loop.stop()


def get(conn: http.client.HTTPConnection, path: str) -> tuple[int, dict[str, Any]]:
    conn.request("GET", path, headers={"Host": "127.0.0.1"})
    r = conn.getresponse()
    return r.status, json.loads(r.read())


def health(port: int) -> tuple[int, dict[str, Any]]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=DEADLINE)
    try:
        return get(conn, "/health")
    finally:
        conn.close()


def chat(port: int, model: str, out: list[Any]) -> None:
    """A streamed chat; its status and body land in ``out``."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=DEADLINE)
    body = {"model": model, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    try:
        conn.request(
            "POST",
            "/v1/chat/completions",
            body=json.dumps(body),
            headers={"Host": "127.0.0.1", "Content-Type": "application/json"},
        )
        r = conn.getresponse()
        out.append((r.status, r.read()))
    except OSError as e:
        out.append((0, repr(e).encode()))
    finally:
        conn.close()


def wait_for(cond: Any, what: str) -> None:
    deadline = time.monotonic() + DEADLINE
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def test_busy_while_every_queue_is_full(tmp_path: Path) -> None:
    with fake_served(tmp_path, queue_size=1) as f:
        status, body = health(f.port)
        assert (status, body["state"], body["loaded"]) == (200, "ready", [])
        f.loop.call(f.service.models.load(f.model_id), 30)
        engine = f.runtime.models[0].engine
        engine.gate.clear()  # every prompt waits here until the test opens it
        results: list[Any] = []
        first = threading.Thread(target=chat, args=(f.port, f.model_id, results))
        first.start()
        assert engine.began.wait(DEADLINE)  # running: one sequence, the queue still empty
        status, body = health(f.port)
        assert (status, body["state"], body["loaded"]) == (200, "ready", [f.model_id])
        second = threading.Thread(target=chat, args=(f.port, f.model_id, results))
        second.start()
        wait_for(lambda: f.runtime.models[0].queue_full, "the second request to queue")
        status, body = health(f.port)
        assert (status, body["state"]) == (200, "busy")
        assert {"status", "version", "loaded", "loading", "providers"} <= body.keys()
        # what busy promises: a request now is refused at once
        third: list[Any] = []
        chat(f.port, f.model_id, third)
        assert third[0][0] == 429
        # every queue: a second model, loaded and idle, takes requests
        spare = next(m.id for m in f.service.models._library.list() if m.id != f.model_id)
        f.loop.call(f.service.models.load(spare), 30)
        assert health(f.port)[1]["state"] == "ready"
        f.loop.call(f.service.models.unload(spare), 30)
        assert health(f.port)[1]["state"] == "busy"
        engine.gate.set()
        first.join(DEADLINE)
        second.join(DEADLINE)
        assert [s for s, _ in results] == [200, 200]
        assert health(f.port)[1]["state"] == "ready"


def test_shutting_down_during_a_graceful_stop(tmp_path: Path) -> None:
    with fake_served(tmp_path) as f:
        # a keep-alive connection opened before the stop: the listener closes, it stays
        conn = http.client.HTTPConnection("127.0.0.1", f.port, timeout=DEADLINE)
        assert get(conn, "/health")[1]["state"] == "ready"
        f.runtime.load_gate.clear()  # the request's model load is held: it stays in flight
        results: list[Any] = []
        held = threading.Thread(target=chat, args=(f.port, f.model_id, results))
        held.start()
        wait_for(lambda: f.service.models.loading() == [f.model_id], "the held load")
        stopping = f.loop.submit(f.controller.stop("test"))
        try:
            status, body = get(conn, "/health")
            assert (status, body["state"], body["status"]) == (503, "shutting_down", "unavailable")
            assert body["loading"] == [f.model_id] and "version" in body
            assert not stopping.done(), "stop waits for the request in flight"
        finally:
            f.runtime.load_gate.set()
            stopping.result(DEADLINE)
            conn.close()
            held.join(DEADLINE)
        assert results and results[0][0] in (200, 503)


def test_starting_until_startup_steps_end_then_ready(tmp_path: Path) -> None:
    with fake_served(tmp_path, starting=True) as f:
        status, body = health(f.port)
        assert (status, body["state"], body["status"]) == (200, "starting", "ok")
        f.controller.startup_done()
        assert health(f.port) == (200, {**body, "state": "ready"})


def test_error_when_a_startup_step_failed(tmp_path: Path) -> None:
    """What ``hearth serve --model`` does: the preload fails, /health says error (503) with why."""
    with fake_served(tmp_path, starting=True, fail_times=1) as f:
        with pytest.raises(HearthError) as failed:  # the runtime's load failure, as the CLI sees it
            f.loop.call(f.service.models.load(f.model_id), 30)
        f.controller.startup_done(failed.value.message)
        status, body = health(f.port)
        assert (status, body["state"], body["status"]) == (503, "error", "unavailable")
        assert "KV cache" in body["error"]
