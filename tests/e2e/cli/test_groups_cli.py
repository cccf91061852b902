"""``hearth providers group|ungroup|groups`` without a server: create and replace a group in
groups.json, refuse unknown members and names that shadow a provider prefix (exit 1), list
each member's state as a health check of its engine finds it now (a live scripted engine is
ready, a closed port unreachable), warn when a provider a group names is removed, and remove
it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.core.util.loop import LoopThread
from tests.conftest import listen_loopback
from tests.e2e.engines import free_port
from tests.e2e.providers.providers_front import cli
from tests.e2e.providers.scripted_engine import Script, engine_app


@pytest.fixture
def live() -> Iterator[str]:
    loop = LoopThread("scripted-engine").start()
    runner, url = loop.call(listen_loopback(engine_app(Script())), 30)
    try:
        yield str(url)
    finally:
        loop.call(runner.cleanup(), 30)
        loop.stop()


def test_group_lifecycle_and_member_states(tmp_path: Path, live: str) -> None:
    home = tmp_path / "home"
    assert cli(home, "providers", "add", "up", live + "/v1", "--kind", "vllm").returncode == 0
    down = f"http://127.0.0.1:{free_port()}/v1"
    assert cli(home, "providers", "add", "down", down, "--kind", "vllm").returncode == 0

    r = cli(home, "providers", "group", "tiny", "up", "down/tiny", "--strategy", "session",
            "--cooldown", "30", "--health-path", "/health",
            "--failures-to-open", "3")  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\t")[:2] == ["tiny", "session"]
    saved = json.loads((home / "config" / "groups.json").read_text())["groups"]["tiny"]
    assert saved["members"] == ["up", "down/tiny"] and saved["cooldown_s"] == 30.0
    assert saved["failures_to_open"] == 3

    r = cli(home, "providers", "groups", "--json")
    assert r.returncode == 0, r.stderr
    (group,) = json.loads(r.stdout)
    states = {m["target"]: m["state"] for m in group["members"]}
    assert states == {"up/tiny": "ready", "down/tiny": "unreachable"}
    text = cli(home, "providers", "groups").stdout
    assert "tiny\tsession" in text and "down/tiny\tunreachable" in text

    r = cli(home, "providers", "group", "tiny", "up", "ghost")
    assert r.returncode == 1 and "ghost" in r.stderr
    r = cli(home, "providers", "group", "up/x", "down")
    assert r.returncode == 1 and "prefix 'up/'" in r.stderr
    r = cli(home, "providers", "group", "g", "up", "--strategy", "random")
    assert r.returncode == 2  # a usage error, as argparse answers one

    r = cli(home, "providers", "rm", "down")  # the group keeps the member: say so
    assert r.returncode == 0 and "groups still naming down: tiny" in r.stderr, r.stderr
    assert cli(home, "providers", "ungroup", "tiny").returncode == 0
    r = cli(home, "providers", "ungroup", "tiny")
    assert r.returncode == 1 and "no group 'tiny'" in r.stderr
    assert json.loads(cli(home, "providers", "groups", "--json").stdout) == []
