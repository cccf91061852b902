"""Named keys shared by two gateways: a key added through one gateway's keys API (or
``hearth keys --state``) works on the other, and one removed there is refused (401) by the
other within 2 s of the removal's answer."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.e2e.shared_state.conftest import ADMIN, Team, auth, listed, poll


def test_a_key_added_on_one_gateway_works_on_the_other_and_its_removal_too(team: Team) -> None:
    a, b = team(2)
    st, made = a.post("/api/v1/keys", {"name": "roamer"}, headers=auth(ADMIN))
    assert st == 201, made
    key = made["key"]

    def b_answers(status: int) -> bool:
        return b.get("/v1/models", headers=auth(key), timeout=30)[0] == status

    poll(lambda: b_answers(200), 2.0, "the other gateway accepts the new key")
    st, _ = a.request("DELETE", "/api/v1/keys/roamer", headers=auth(ADMIN))
    assert st == 200
    poll(lambda: b_answers(401), 2.0, "the other gateway refuses the removed key")
    assert a.get("/v1/models", headers=auth(key))[0] == 401


def _cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HEARTH_HOME": str(home)}
    return subprocess.run(
        [sys.executable, "-m", "app", "keys", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_keys_command_edits_the_shared_keys(
    team: Team, redis_server: Any, tmp_path: Path
) -> None:
    (gw,) = team(1)
    elsewhere = tmp_path / "laptop"  # a machine with no server, only the Redis URL
    made = _cli(elsewhere, "add", "from-cli", "--rpm", "30", "--state", redis_server.url)
    assert made.returncode == 0, made.stderr
    secret = made.stdout.strip()
    poll(lambda: listed(gw, "from-cli"), 2.0, "the gateway sees the key")
    assert gw.get("/v1/models", headers=auth(secret))[0] == 200
    shown = _cli(elsewhere, "ls", "--json", "--state", redis_server.url)
    assert [k["name"] for k in json.loads(shown.stdout)] == ["from-cli"]
    assert _cli(elsewhere, "rm", "from-cli", "--state", redis_server.url).returncode == 0
    poll(lambda: gw.get("/v1/models", headers=auth(secret))[0] == 401, 2.0, "refused")


def test_a_bad_state_url_is_refused_at_start(tmp_path: Path) -> None:
    env = {**os.environ, "HEARTH_HOME": str(tmp_path / "home")}
    r = subprocess.run(
        [sys.executable, "-m", "app", "serve", "--port", "0", "--state", "http://cache.lan"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and "not a Redis URL" in r.stderr
