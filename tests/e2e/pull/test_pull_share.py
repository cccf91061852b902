"""Two pulls of one file at once, from two real processes (SECURITY.md 20): one file with the
right sha256, both succeed with the same model id, and the fake Hub served the bytes once.

The first pull is held mid-transfer at a fake-Hub gate until the second one shows that it is
waiting for (or following) the first: the two really overlap, whatever the machine's speed.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from tests.support.fakehub import FakeHub, gguf_bytes
from tests.support.hearthproc import PullStream, Server, hold_settings, ls, pull_proc

REPO = "acme/tiny-GGUF"
FILE = "tiny-Q4_K_M.gguf"
Q8 = "tiny-Q8_0.gguf"
MID = 300_000


@pytest.fixture
def hub(fake_hub: FakeHub, tmp_path: Path) -> FakeHub:
    b = tmp_path / "build"
    fake_hub.add_repo(
        REPO,
        {FILE: gguf_bytes(b, elems=150_000), Q8: gguf_bytes(b, file_type=7, elems=150_000)},
        tags=["gguf"],
    )
    return fake_hub


def installed(home: Path, hub: FakeHub, name: str) -> Path:
    """The one file in the models folder for ``name``, checked against the Hub's sha256."""
    path = home / "models" / "acme" / "tiny-GGUF" / name
    want = hub.repos[REPO].files[name].sha256
    assert hashlib.sha256(path.read_bytes()).hexdigest() == want
    left = [p.name for p in path.parent.iterdir() if p.name.startswith(".")]
    assert [n for n in left if not n.endswith(".lock")] == []  # no partial, no record
    return path


def test_two_hearth_pull_processes_share_one_download(hub: FakeHub, tmp_path: Path) -> None:
    home = tmp_path / "h"
    hold_settings(home)
    gate = hub.hold(REPO, FILE, at=MID)
    first = pull_proc(home, hub, REPO)
    second = None
    try:
        gate.wait()
        second = pull_proc(home, hub, REPO)
        second.wait_stderr("waiting:")  # it found the first one's lock on the file
        gate.open()
        assert first.finish() == 0, first.stderr
        assert second.finish() == 0, second.stderr
    finally:
        gate.open()
        first.close()
        if second is not None:
            second.close()
    assert first.out.strip() == second.out.strip() == "tiny-q4_k_m"
    assert hub.ranges(REPO, FILE) == [None]  # the bytes were served once
    installed(home, hub, FILE)
    assert [m["id"] for m in ls(home)] == ["tiny-q4_k_m"]


def test_a_server_pull_and_a_cli_pull_share_one_download(hub: FakeHub, tmp_path: Path) -> None:
    home = tmp_path / "h"
    hold_settings(home)
    # 1. a CLI pull runs in its own process (no server yet); then a server pulls the same file
    gate = hub.hold(REPO, FILE, at=MID)
    cli = pull_proc(home, hub, REPO)
    srv = None
    try:
        gate.wait()
        srv = Server(home, hub)
        stream = PullStream(srv.root, REPO)
        stream.wait_for(lambda line: line.get("status") == "waiting")  # on the CLI's lock
        gate.open()
        assert cli.finish() == 0, cli.stderr
        done = stream.result()
        assert done["status"] == "success", stream.lines
        assert done["model"] == cli.out.strip() == "tiny-q4_k_m"
        assert hub.ranges(REPO, FILE) == [None]
        installed(home, hub, FILE)

        # 2. the server pulls first; a CLI pull goes through it and follows the same download
        gate2 = hub.hold(REPO, Q8, at=MID)
        stream2 = PullStream(srv.root, f"{REPO}:Q8_0")
        gate2.wait()
        cli2 = pull_proc(home, hub, f"{REPO}:q8_0")
        try:
            cli2.wait_stderr("downloading:")  # following the server's running download
            gate2.open()
            assert cli2.finish() == 0, cli2.stderr
        finally:
            gate2.open()
            cli2.close()
        done2 = stream2.result()
        assert done2["status"] == "success" and done2["model"] == cli2.out.strip() == "tiny-q8_0"
        assert hub.ranges(REPO, Q8) == [None]
        installed(home, hub, Q8)
        code, body = srv.api("GET", "/api/v1/downloads")
        assert code == 200
        assert sorted((d["model_id"], d["state"]) for d in body["downloads"]) == [
            ("tiny-q4_k_m", "completed"),
            ("tiny-q8_0", "completed"),
        ]
    finally:
        gate.open()
        cli.close()
        if srv is not None:
            assert srv.stop() == 0, srv.stderr
    entries = json.loads((home / "data" / "library.json").read_text())["models"]
    assert sorted(e["id"] for e in entries) == ["tiny-q4_k_m", "tiny-q8_0"]  # one entry each
