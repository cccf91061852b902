"""Gateways that share their state: real ``hearth serve --state`` processes, each with its own
HEARTH_HOME (as two machines would have), on one real redis-server."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.serveproc import ServeProc, start_serve

ADMIN = "sk-team-admin"  # each gateway's --api-key: admin, no limits
Team = Callable[..., list[ServeProc]]


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def poll(cond: Callable[[], bool], deadline_s: float, what: str) -> None:
    """Until ``cond()`` holds, checking every 0.05 s; fails after ``deadline_s``."""
    deadline = time.monotonic() + deadline_s
    while not cond():
        assert time.monotonic() < deadline, f"{what}: not within {deadline_s} s"
        time.sleep(0.05)


def listed(gw: ServeProc, name: str) -> bool:
    st, body = gw.get("/api/v1/keys", headers=auth(ADMIN), timeout=30)
    return st == 200 and any(k["name"] == name for k in body["keys"])


@pytest.fixture
def team(redis_server: Any, tmp_path: Path) -> Iterator[Team]:
    """``team(n, models=(...), **settings)``: n gateways on the test's redis-server with these
    settings sections (model-less by default: the keys API, /v1/models, /health and /metrics
    need no model)."""
    started: list[ServeProc] = []

    def start(n: int = 2, models: tuple[Path, ...] = (), **settings: Any) -> list[ServeProc]:
        for _ in range(n):
            home = tmp_path / f"gw{len(started)}"
            args = ("--state", redis_server.url, "--api-key", ADMIN)
            started.append(start_serve(home, *models, settings=settings, args=args))
        return started[-n:]

    try:
        yield start
    finally:
        for gw in started:
            gw.stop()
