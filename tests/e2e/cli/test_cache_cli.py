"""``hearth serve --cache exact`` and ``hearth cache stats|clear`` as real processes (issue
14): the server caches for that run whatever the settings say, the CLI reads and clears the
cache file while it runs (the server misses after the clear), and the exit codes are the other
commands' (0 ok, 1 failure, 2 usage)."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

from tests.support.hearthproc import DEADLINE, Server, hearth, wait_until

pytestmark = pytest.mark.model


def chat(root: str, model: str) -> str | None:
    body = {"model": model, "messages": [{"role": "user", "content": "Hi"}], "temperature": 0}
    body["max_tokens"] = 8
    req = urllib.request.Request(
        root + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=DEADLINE) as r:
        assert r.status == 200
        r.read()
        return r.headers.get("x-hearth-cache")


def stats(home: Path) -> dict[str, object]:
    r = hearth(home, None, "cache", "stats", "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_serve_cache_flag_and_the_cli_on_a_running_server(
    tmp_path: Path, smollm2_path: Path
) -> None:
    home = tmp_path / "h"
    srv = Server(home, None, "--cache", "exact", "--model", str(smollm2_path))
    try:
        # the --model preload imports it after the server listens: wait for /health's ready
        wait_until(lambda: srv.api("GET", "/health")[1].get("state") == "ready", "the preload")
        model = srv.api("GET", "/v1/models")[1]["data"][0]["id"]
        assert [chat(srv.root, model) for _ in range(2)] == ["miss", "hit"]
        got = stats(home)
        assert (got["entries"], got["hits"], got["misses"]) == (1, 1, 1)
        assert got["mode"] == "off"  # the settings' mode: --cache is for that run only
        r = hearth(home, None, "cache", "clear")
        assert r.returncode == 0 and r.stdout.strip() == "cleared 1 cached response"
        assert stats(home)["entries"] == 0
        assert [chat(srv.root, model) for _ in range(2)] == ["miss", "hit"]
    finally:
        assert srv.stop() == 0


def test_exit_codes(tmp_path: Path) -> None:
    home = tmp_path / "h"
    assert stats(home)["entries"] == 0  # no file yet: an empty cache, and none is made
    assert not (home / "data" / "response_cache.sqlite").exists()
    assert hearth(home, None, "cache").returncode == 2
    assert hearth(home, None, "serve", "--cache", "sometimes").returncode == 2
    (home / "data" / "response_cache.sqlite").write_bytes(b"not a database" * 100)
    r = hearth(home, None, "cache", "stats", "--json")
    assert r.returncode == 1 and "hearth: error:" in r.stderr and r.stdout == ""
    assert hearth(home, None, "cache", "clear").returncode == 1
