"""A disk too small or filling up (SECURITY.md 21), on a real 3 MiB filesystem: refused before a
byte moves when the file cannot fit; a real ENOSPC mid-write gives a clean error, removes the
partial file and its record, leaves the library index consistent, and the server keeps serving.

The models folder is a tmpfs (tests/support/smalldisk.py): mounted directly where the tests may mount
(root), else inside a user+mount namespace that the Hearth processes enter, so the test runs on
machines that allow no mounts. The free-space check is the real one; the disk fills up for real
while the fake Hub holds the transfer at a gate: another program wrote a big file meanwhile.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.fakehub import FakeHub, gguf_bytes
from tests.support.hearthproc import (
    PullStream,
    Server,
    hearth,
    hold_settings,
    ls,
    pull_proc,
    wait_until,
)
from tests.support.smalldisk import MODES, SmallDisk, open_small_disk

REPO = "acme/tiny-GGUF"
FILE = "tiny-Q4_K_M.gguf"  # ~600 KB: fits
BIG_REPO = "acme/big-GGUF"
BIG = "big-Q4_K_M.gguf"  # ~4 MB: cannot fit
DISK = 3 << 20
MID = 200_000


@pytest.fixture
def hub(fake_hub: FakeHub, tmp_path: Path) -> FakeHub:
    b = tmp_path / "build"
    fake_hub.add_repo(REPO, {FILE: gguf_bytes(b, elems=150_000)}, tags=["gguf"])
    fake_hub.add_repo(BIG_REPO, {BIG: gguf_bytes(b, elems=1_000_000)}, tags=["gguf"])
    return fake_hub


@pytest.fixture(params=MODES)
def disk(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SmallDisk]:
    """A 3 MiB models folder for HEARTH_HOME ``tmp_path/h``."""
    home = tmp_path / "h"
    hold_settings(home)
    d, why = open_small_disk(home / "models", DISK, request.param)
    if d is None:
        pytest.skip(why)
    try:
        yield d
    finally:
        d.close()


@pytest.fixture(params=MODES)
def home_disk(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SmallDisk]:
    """All of HEARTH_HOME ``tmp_path/h`` on a 3 MiB disk: the library index shares it."""
    d, why = open_small_disk(tmp_path / "h", DISK, request.param)
    if d is None:
        pytest.skip(why)
    try:
        hold_settings(d.view())
        yield d
    finally:
        d.close()


def leftovers(disk: SmallDisk) -> list[str]:
    """Anything under the models folder but the filler and lock files."""
    root = disk.view()
    return sorted(
        str(p.relative_to(root))
        for p in root.rglob("*")
        if p.is_file() and p.name != "filler.bin" and not p.name.endswith(".lock")
    )


def wait_loaded(srv: Server) -> None:
    """``--model`` imports and loads after the server listens."""

    def loaded() -> bool:
        models = srv.api("GET", "/api/v1/models")[1]["models"]
        return bool(models) and models[0]["state"] == "loaded"

    wait_until(loaded, "the chat model to load")


def still_serving(srv: Server, chat_model: str) -> None:
    """Health, the model list and a chat answer, after the disk filled up."""
    code, health = srv.api("GET", "/health")
    assert code == 200, health
    code, listed = srv.api("GET", "/v1/models")
    assert code == 200, listed
    assert chat_model in [m["id"] for m in listed["data"]]
    code, answer = srv.api(
        "POST",
        "/v1/chat/completions",
        {"model": chat_model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4},
    )
    assert code == 200, answer
    assert answer["choices"][0]["message"]["content"]


def index_ids(home: Path) -> list[str]:
    """The library index parses and lists these ids (no file yet: nothing indexed)."""
    index = home / "data" / "library.json"
    if not index.exists():
        return []
    return sorted(m["id"] for m in json.loads(index.read_text())["models"])


def test_a_cli_pull_refused_or_cut_by_a_full_disk(hub: FakeHub, disk: SmallDisk) -> None:
    home = disk.path.parent
    pre = disk.prefix
    r = hearth(home, hub, "pull", BIG_REPO, prefix=pre)
    assert r.returncode == 1 and r.stdout == ""
    assert "Not enough disk space" in r.stderr, r.stderr
    assert hub.file_requests(BIG_REPO, BIG) == []  # refused before a byte moved

    gate = hub.hold(REPO, FILE, at=MID)
    proc = pull_proc(home, hub, REPO, prefix=pre)
    partial = disk.view(disk.path / "acme" / "tiny-GGUF" / f".{FILE}.partial")
    try:
        gate.wait()
        wait_until(lambda: partial.exists() and partial.stat().st_size == MID, "bytes on disk")
        filler = disk.fill()
        gate.open()
        assert proc.finish() == 1
    finally:
        gate.open()
        proc.close()
    assert proc.out == ""
    assert "disk filled up" in proc.stderr and "partial download was removed" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert leftovers(disk) == []  # the partial file and its record are gone
    assert index_ids(home) == [] and ls(home, pre) == []

    filler.unlink()  # space again: the same pull now works, from zero
    r = hearth(home, hub, "pull", REPO, prefix=pre)
    assert r.returncode == 0 and r.stdout.strip() == "tiny-q4_k_m", r.stderr
    assert hub.ranges(REPO, FILE) == [None, None]
    got = disk.view(disk.path / "acme" / "tiny-GGUF" / FILE).read_bytes()
    assert hashlib.sha256(got).hexdigest() == hub.repos[REPO].files[FILE].sha256
    assert index_ids(home) == ["tiny-q4_k_m"]


@pytest.mark.model
def test_a_full_disk_fails_a_server_pull_cleanly_and_serving_goes_on(
    hub: FakeHub, disk: SmallDisk, smollm2_path: Path
) -> None:
    home = disk.path.parent
    srv = Server(home, hub, "--model", str(smollm2_path), prefix=disk.prefix)
    try:
        wait_loaded(srv)
        [chat_model] = index_ids(home)  # imported in place: its file is not on the small disk

        refused = PullStream(srv.root, BIG_REPO).result()
        assert refused["status"] == "error", refused
        assert refused["error"]["code"] == "insufficient_storage"
        assert "Not enough disk space" in refused["error"]["message"]
        assert hub.file_requests(BIG_REPO, BIG) == []

        gate = hub.hold(REPO, FILE, at=MID)
        stream = PullStream(srv.root, REPO)
        partial = disk.view(disk.path / "acme" / "tiny-GGUF" / f".{FILE}.partial")
        try:
            gate.wait()
            wait_until(lambda: partial.exists() and partial.stat().st_size == MID, "bytes")
            filler = disk.fill()
        finally:
            gate.open()
        cut = stream.result()
        assert cut["status"] == "error", stream.lines
        assert cut["error"]["code"] == "insufficient_storage"
        assert "filled up" in cut["error"]["message"]
        assert leftovers(disk) == []
        assert index_ids(home) == [chat_model]  # consistent: parses, nothing half-added
        code, body = srv.api("GET", "/api/v1/downloads")
        failed = [d for d in body["downloads"] if d["repo_id"] == REPO]
        assert [(d["state"], d["error_code"]) for d in failed] == [
            ("failed", "insufficient_storage")
        ]

        still_serving(srv, chat_model)

        filler.unlink()  # space again: the same pull now works
        done = PullStream(srv.root, REPO).result()
        assert done["status"] == "success" and done["model"] == "tiny-q4_k_m", done
        got = disk.view(disk.path / "acme" / "tiny-GGUF" / FILE).read_bytes()
        assert hashlib.sha256(got).hexdigest() == hub.repos[REPO].files[FILE].sha256
        assert index_ids(home) == sorted([chat_model, "tiny-q4_k_m"])
    finally:
        assert srv.stop() == 0, srv.stderr


@pytest.mark.model
def test_a_disk_full_when_the_index_is_written_is_a_clean_error(
    hub: FakeHub, home_disk: SmallDisk, smollm2_path: Path
) -> None:
    """Every byte landed, then the disk filled: the rename works, the index write cannot."""
    disk, home = home_disk, home_disk.path
    data = hub.repos[REPO].files[FILE].data
    srv = Server(home, hub, "--model", str(smollm2_path), prefix=disk.prefix)
    try:
        wait_loaded(srv)
        [chat_model] = index_ids(disk.view())
        gate = hub.hold(REPO, FILE, at=len(data), chunked=True)  # after the last byte
        stream = PullStream(srv.root, REPO)
        partial = disk.view(home / "models" / "acme" / "tiny-GGUF" / f".{FILE}.partial")
        try:
            gate.wait()
            wait_until(lambda: partial.exists() and partial.stat().st_size == len(data), "bytes")
            filler = disk.fill()
        finally:
            gate.open()
        cut = stream.result()
        assert cut["status"] == "error", stream.lines
        assert cut["error"]["code"] == "insufficient_storage", cut
        assert "filled up" in cut["error"]["message"]
        assert "Traceback" not in srv.stderr
        assert index_ids(disk.view()) == [chat_model]  # the previous index, still readable
        still_serving(srv, chat_model)

        filler.unlink()  # space again: pulling again finishes it without fetching the bytes
        done = PullStream(srv.root, REPO).result()
        assert done["status"] == "success" and done["model"] == "tiny-q4_k_m", done
        assert hub.ranges(REPO, FILE) == [None]
        got = disk.view(home / "models" / "acme" / "tiny-GGUF" / FILE).read_bytes()
        assert got == data
        assert index_ids(disk.view()) == sorted([chat_model, "tiny-q4_k_m"])
    finally:
        assert srv.stop() == 0, srv.stderr
