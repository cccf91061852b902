"""``hearth serve --model``: /health says ``starting`` while the preload runs (when a probe is
quick enough to see it) and ``ready`` once it is done, never anything else meanwhile."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

DEADLINE = 90.0  # liveness only


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.model
def test_serve_preload_is_starting_then_ready(tmp_path: Path, smollm2_path: Path) -> None:
    env = {**os.environ, "HEARTH_HOME": str(tmp_path / "h")}
    env.pop("HEARTH_API_KEY", None)
    port = _free_port()
    p = subprocess.Popen(
        [sys.executable, "-m", "app", "serve", "--port", str(port), "--model", str(smollm2_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    try:
        assert p.stdout is not None and p.stdout.readline().strip().endswith(f":{port}/v1")
        seen: list[str] = []
        deadline = time.monotonic() + DEADLINE
        body: dict[str, object] = {}
        while time.monotonic() < deadline:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=30) as r:
                assert r.status == 200
                body = json.loads(r.read())
            state = str(body["state"])
            if not seen or seen[-1] != state:
                seen.append(state)
            if state == "ready":
                break
            time.sleep(0.02)
        assert seen in (["starting", "ready"], ["ready"]), seen
        assert seen[-1] == "ready" and len(body["loaded"]) == 1  # type: ignore[arg-type]
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(60)
