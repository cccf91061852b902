"""kill -9 at each point of a pull (SECURITY.md 17), for a `hearth pull` and for a `hearth serve`
pulling through its API: afterwards a fresh process lists nothing partial as installed, lists the
download as paused and resumes it from the bytes on disk, or cleans up what cannot be resumed.

Each point is held, not timed: the fake Hub holds the transfer at a byte offset (a gate the test
opens), and after the rename the test itself holds the library index's lock, as another Hearth
process writing the index would, so the killed process sits between the rename and the index.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.fakehub import FakeHub, gguf_bytes
from tests.support.hearthproc import (
    Proc,
    PullStream,
    Server,
    hearth,
    hold_settings,
    ls,
    pull_proc,
    wait_until,
)

REPO = "acme/tiny-GGUF"
FILE = "tiny-Q4_K_M.gguf"
MID = 300_000

POINTS = [
    "before-first-byte",  # held right after the response headers
    "mid-transfer",  # held at byte MID
    "all-bytes-before-rename",  # every byte on disk and hashed, the body not ended: no rename yet
    "after-rename-before-index",  # renamed into place, waiting for the library index's lock
]


@pytest.fixture
def hub(fake_hub: FakeHub, tmp_path: Path) -> FakeHub:
    fake_hub.add_repo(REPO, {FILE: gguf_bytes(tmp_path / "build", elems=150_000)}, tags=["gguf"])
    return fake_hub


@contextlib.contextmanager
def index_lock(home: Path) -> Iterator[None]:
    """Hold the library index's lock (the one ``app.core.util.fsutil.file_lock`` takes)."""
    lock = home / "data" / "library.json.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def leftovers(models: Path) -> list[str]:
    """Partial files, sidecars and staging folders (lock files are harmless and allowed)."""
    if not models.exists():
        return []
    return sorted(
        str(p.relative_to(models))
        for p in models.rglob("*")
        if p.name.startswith(".") and not p.name.endswith(".lock")
    )


@pytest.mark.parametrize("point", POINTS)
@pytest.mark.parametrize("killed", ["pull", "serve"])
def test_kill_9_then_a_fresh_process_resumes_or_cleans_up(
    hub: FakeHub, tmp_path: Path, killed: str, point: str
) -> None:
    home = tmp_path / "h"
    hold_settings(home)
    data = hub.repos[REPO].files[FILE].data
    sha = hashlib.sha256(data).hexdigest()
    models = home / "models"
    folder = models / "acme" / "tiny-GGUF"
    partial, final = folder / f".{FILE}.partial", folder / FILE
    at = {
        "before-first-byte": 0,
        "mid-transfer": MID,
        "all-bytes-before-rename": len(data),
        "after-rename-before-index": MID,
    }[point]
    gate = hub.hold(REPO, FILE, at=at, chunked=point == "all-bytes-before-rename")

    victim: Proc
    if killed == "pull":
        victim = pull_proc(home, hub, REPO)
    else:
        victim = Server(home, hub)
        stream = PullStream(victim.root, REPO)
    try:
        gate.wait()
        if point == "after-rename-before-index":
            with index_lock(home):
                gate.open()
                wait_until(lambda: final.exists() and not partial.exists(), "the rename")
                victim.kill9()
        else:
            # the bytes before the gate are on disk (for byte 0: the file is open)
            wait_until(
                lambda: partial.exists() and partial.stat().st_size == at, f"{at} bytes on disk"
            )
            victim.kill9()
    finally:
        gate.open()
        victim.close()
    assert victim.p.returncode == -9
    if killed == "serve":
        assert stream.result()["status"] not in ("success", "error")  # cut off, no verdict

    # a fresh process lists nothing partial as installed
    listed = ls(home)
    if point == "after-rename-before-index":  # the verified file is in place: it may be listed
        assert [m["id"] for m in listed] == ["tiny-q4_k_m"]
        assert Path(listed[0]["path"]).read_bytes() == data
    else:
        assert listed == []

    served_before = len(hub.file_requests(REPO, FILE))
    srv = Server(home, hub)
    try:
        code, body = srv.api("GET", "/api/v1/downloads")
        assert code == 200
        found = [(d["state"], d["bytes_done"], d["model_id"]) for d in body["downloads"]]
        if point == "before-first-byte":  # nothing to resume: cleaned up
            assert found == []
            assert leftovers(models) == []
        elif point == "after-rename-before-index":  # done but for the index: finished now
            assert found == [("completed", len(data), "tiny-q4_k_m")]
            assert leftovers(models) == []
        else:
            assert found == [("paused", at, None)]

        # pulling again (through the fresh server) resumes from the bytes on disk
        r = hearth(home, hub, "pull", REPO)
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == "tiny-q4_k_m"
        want = {
            "before-first-byte": [None],  # from zero
            "mid-transfer": [f"bytes={MID}-"],  # from the bytes on disk
            "all-bytes-before-rename": [],  # every byte was there: re-hashed, not fetched
            "after-rename-before-index": [],
        }[point]
        assert [s.range for s in hub.file_requests(REPO, FILE)[served_before:]] == want

        code, models_list = srv.api("GET", "/v1/models")
        assert "tiny-q4_k_m" in [m["id"] for m in models_list["data"]]
    finally:
        assert srv.stop() == 0, srv.stderr
    assert hashlib.sha256(final.read_bytes()).hexdigest() == sha
    assert leftovers(models) == []
    entries = json.loads((home / "data" / "library.json").read_text())["models"]
    [entry] = entries
    assert entry["id"] == "tiny-q4_k_m" and entry["origin"] == "downloaded"
    assert entry["extra"]["hub"]["repo_id"] == REPO  # registered as the download, not adopted
    assert entry["extra"]["hub"]["sha256"] == {FILE: sha}


def test_kill_9_between_shards_then_resume_verifies_the_finished_shard(
    fake_hub: FakeHub, tmp_path: Path
) -> None:
    """A sharded GGUF killed with its first shard complete and verified but not renamed (the
    shards are renamed together at the end) and the second one half-way: the first is re-hashed
    from disk, not fetched again; the second resumes with Range."""
    first, second = "Q8_0/big-Q8_0-00001-of-00002.gguf", "Q8_0/big-Q8_0-00002-of-00002.gguf"
    shards = {first: gguf_bytes(tmp_path / "build", elems=150_000), second: b"\1" * 400_000}
    fake_hub.add_repo("acme/big-GGUF", shards, tags=["gguf"])
    home = tmp_path / "h"
    hold_settings(home)
    folder = home / "models" / "acme" / "big-GGUF"
    part2 = folder / ".big-Q8_0-00002-of-00002.gguf.partial"
    gate = fake_hub.hold("acme/big-GGUF", second, at=100_000)
    victim = pull_proc(home, fake_hub, "acme/big-GGUF:Q8_0")
    try:
        gate.wait()
        wait_until(lambda: part2.exists() and part2.stat().st_size == 100_000, "shard 2 bytes")
        victim.kill9()
    finally:
        gate.open()
        victim.close()
    assert sorted(p.name for p in folder.iterdir() if not p.name.endswith(".lock")) == [
        ".big-Q8_0-00001-of-00002.gguf.partial",  # every byte, verified, not renamed
        ".big-Q8_0-00001-of-00002.gguf.partial.json",
        ".big-Q8_0-00002-of-00002.gguf.partial",
    ]
    assert ls(home) == []

    srv = Server(home, fake_hub)
    try:
        code, body = srv.api("GET", "/api/v1/downloads")
        assert [(d["state"], d["bytes_done"]) for d in body["downloads"]] == [
            ("paused", len(shards[first]) + 100_000)
        ]
        r = hearth(home, fake_hub, "pull", "acme/big-GGUF:Q8_0")
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == "big-q8_0"
    finally:
        assert srv.stop() == 0, srv.stderr
    assert fake_hub.ranges("acme/big-GGUF", first) == [None]  # re-hashed from disk, not fetched
    assert fake_hub.ranges("acme/big-GGUF", second) == [None, "bytes=100000-"]
    for name, data in shards.items():
        assert (folder / name.split("/")[1]).read_bytes() == data
    assert leftovers(home / "models") == []
    assert [m["id"] for m in ls(home)] == ["big-q8_0"]
