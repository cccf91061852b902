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

from tests.fakehub import FakeHub, gguf_bytes
from tests.hearthproc import (
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
    """Hold the library index's lock (the one ``app.core.fsutil.file_lock`` takes)."""
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
