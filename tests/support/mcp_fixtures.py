"""Real MCP servers for the MCP tests: tests/support/mcp_server.py over stdio (the manager starts it)
and over Streamable HTTP (a subprocess on a loopback port, started here)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

SERVER = str(Path(__file__).resolve().parent / "mcp_server.py")
START_LIMIT = 60.0  # generous: a slow machine still starts uvicorn well within this


def stdio_entry(mode: str = "stdio") -> dict[str, Any]:
    return {"command": sys.executable, "args": [SERVER, mode]}


def write_config(path: Path, servers: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"mcpServers": servers}), encoding="utf-8")
    return path


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture(scope="module")
def http_mcp_url() -> Iterator[str]:
    """The test server over Streamable HTTP on a free loopback port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, SERVER, "http", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + START_LIMIT
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the HTTP MCP test server exited ({proc.returncode})")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("the HTTP MCP test server never listened") from None
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
