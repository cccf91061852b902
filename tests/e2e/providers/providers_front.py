"""Helpers for the provider tests: a front `hearth serve` whose providers are real engines
(tests/e2e/engines.py), the CLI run against its HEARTH_HOME, and waits on its listings."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.e2e.engines import Reply, http_request
from tests.e2e.serveproc import ServeProc

DEADLINE_S = 120.0


def cli(home: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HEARTH_HOME": str(home)}
    env.pop("HEARTH_API_KEY", None)
    return subprocess.run(
        [sys.executable, "-m", "app", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        input=stdin,
    )


def call(front: ServeProc, method: str, path: str, body: Any = None, **kw: Any) -> Reply:
    return http_request(front.root + path, method, body, **kw)


def until(what: str, fn: Callable[[], Any], deadline_s: float = DEADLINE_S) -> Any:
    """``fn()`` once it is truthy (polled; a generous deadline, never a speed assumption)."""
    end = time.monotonic() + deadline_s
    while True:
        got = fn()
        if got:
            return got
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def model_ids(front: ServeProc) -> list[str]:
    r = call(front, "GET", "/v1/models")
    return [m["id"] for m in r.body["data"]] if r.status == 200 else []


def provider_state(front: ServeProc, name: str) -> str | None:
    r = call(front, "GET", "/health")
    for p in r.body.get("providers", []) if isinstance(r.body, dict) else []:
        if p["name"] == name:
            return str(p["state"])
    return None


def wait_ready(front: ServeProc, *names: str) -> None:
    for n in names:
        until(f"provider {n} ready", lambda n=n: provider_state(front, n) == "ready")


def stream_events(raw: bytes) -> tuple[list[Any], bool]:
    """The JSON of each SSE ``data:`` line, and whether ``[DONE]`` came."""
    out, done = [], False
    for line in raw.decode(errors="replace").splitlines():
        if line.startswith("data:"):
            data = line[5:].strip()
            if data == "[DONE]":
                done = True
            elif data:
                out.append(json.loads(data))
    return out, done
