"""DownloadManager against the fake Hub: verified, resumable, atomic downloads (SECURITY.md 15-22).

Real parts throughout: huggingface_hub's client, real HTTP on a loopback port, real files under
tmp_path, the real ModelLibrary. Faults come from the fake Hub (dropped connections, stalls,
flipped bytes, ignored Range, 429) and, for the disk, a real 2 MiB tmpfs where mounting works.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from app.core import events as ev
from app.core.events import EventHub
from app.core.hub import HubClient
from app.core.hub.downloads import DownloadManager
from app.core.hub.downloads.manager import DownloadPolicy
from app.core.library.index import ModelLibrary
from app.errors import (
    AccessDenied,
    ChecksumMismatch,
    DownloadCancelled,
    InsufficientStorage,
    RepoRefused,
)
from tests.support.fakehub import TOKEN, FakeHub, gguf_bytes, mlx_files
from tests.support.smalldisk import SmallDisk, open_small_disk

REPO = "acme/tiny-GGUF"
FILE = "tiny-Q4_K_M.gguf"
SIZE_ELEMS = 150_000  # ~600 KB: big enough to cut, stall and resume in the middle


@dataclass
class Env:
    hub: FakeHub
    root: Path
    library: ModelLibrary
    events: EventHub
    seen: list[ev.Event] = field(default_factory=list)
    managers: list[DownloadManager] = field(default_factory=list)

    @property
    def models(self) -> Path:
        return self.library.models_dir

    def manager(self, **kw: Any) -> DownloadManager:
        token = kw.pop("token", None)
        kw.setdefault("stall_timeout", 5.0)
        kw.setdefault("backoff_base", 0.05)
        kw.setdefault("lock_poll", 0.05)
        kw.setdefault("progress_interval", 0.0)
        hub = HubClient(endpoint=self.hub.endpoint, token=token)
        free = {"free_space": kw.pop("free_space")} if "free_space" in kw else {}
        dm = DownloadManager(self.library, hub, self.events, **free, policy=DownloadPolicy(**kw))
        self.managers.append(dm)
        return dm

    def data(self, repo: str = REPO, path: str = FILE) -> bytes:
        return self.hub.repos[repo].files[path].data

    def leftovers(self) -> list[str]:
        """Anything partial, temporary or sidecar under the models folder."""
        return sorted(
            str(p.relative_to(self.models))
            for p in self.models.rglob("*")
            if p.name.startswith(".") and not p.name.endswith(".lock")
        )

    def of(self, kind: type) -> list[Any]:
        return [e for e in self.seen if isinstance(e, kind)]


@pytest.fixture
def env(fake_hub: FakeHub, tmp_path: Path) -> Iterator[Env]:
    b = tmp_path / "build"
    fake_hub.add_repo(
        REPO,
        {
            FILE: gguf_bytes(b, elems=SIZE_ELEMS),
            "tiny-Q8_0.gguf": gguf_bytes(b, file_type=7, elems=SIZE_ELEMS),
        },
        tags=["gguf"],
    )
    events = EventHub()
    e = Env(
        fake_hub,
        tmp_path,
        ModelLibrary(tmp_path / "data" / "library.json", tmp_path / "models"),
        events,
    )
    events.subscribe(e.seen.append)
    yield e


async def wait_for(cond: Any, timeout: float = 10.0) -> None:
    for _ in range(int(timeout / 0.02)):
        if cond():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("condition not met in time")


def partial_size(env: Env, name: str = FILE) -> int:
    p = env.models / "acme" / "tiny-GGUF" / f".{name}.partial"
    return p.stat().st_size if p.exists() else -1


# -- the happy path -------------------------------------------------------------------------------
async def test_pull_installs_a_verified_file_and_tells_everyone(env: Env) -> None:
    dm = env.manager()
    model = await dm.pull(REPO)  # no quant: Q4_K_M
    path = Path(model.path)
    assert path == (env.models / "acme" / "tiny-GGUF" / FILE).resolve()
    assert hashlib.sha256(path.read_bytes()).hexdigest() == env.hub.repos[REPO].files[FILE].sha256
    assert model.owned and model.origin == "downloaded" and model.quantization == "Q4_K_M"
    assert model.extra["hub"]["repo_id"] == REPO
    assert [m.id for m in env.library.list()] == [model.id]
    assert env.leftovers() == []
    assert env.of(ev.DownloadQueued)[0].total_bytes == len(env.data())
    done = [e.bytes_done for e in env.of(ev.DownloadProgressed) if e.state == "downloading"]
    assert done == sorted(done) and done[-1] == len(env.data())
    fin = env.of(ev.DownloadFinished)
    assert len(fin) == 1 and fin[0].model_id == model.id
    assert env.of(ev.LibraryChanged)
    s = dm.list()[0]
    assert s.state == "completed" and s.model_id == model.id and s.bytes_done == s.total_bytes
    # pulling again reuses the file: no second download
    again = await dm.pull(f"{REPO}:q4_k_m")
    assert again.id == model.id and len(env.hub.file_requests(REPO, FILE)) == 1


async def test_the_event_loop_keeps_running_during_a_download(env: Env) -> None:
    """Writing and hashing happen off the loop: a ticker keeps ticking (generous bound).

    The fake Hub holds the transfer half-way until the ticker has ticked enough: how long the
    download lasts is the test's decision, not the machine's speed.
    """
    big = gguf_bytes(env.root / "b", elems=1_000_000)
    env.hub.add_repo("acme/big-GGUF", {"big-Q4_K_M.gguf": big})
    gate = env.hub.hold("acme/big-GGUF", "big-Q4_K_M.gguf", at=len(big) // 2)
    gaps: list[float] = []
    stop = asyncio.Event()

    async def ticker() -> None:
        loop = asyncio.get_running_loop()
        last = loop.time()
        while not stop.is_set():
            await asyncio.sleep(0.01)
            now = loop.time()
            gaps.append(now - last)
            last = now

    t = asyncio.create_task(ticker())
    try:
        pull = asyncio.create_task(env.manager(stall_timeout=600).pull("acme/big-GGUF"))
        await gate.wait_async()
        ticks = len(gaps)
        await wait_for(lambda: len(gaps) >= ticks + 20, timeout=60)  # ticking while it waits
        gate.open()
        model = await pull
    finally:
        stop.set()
        await t
    assert Path(model.path).stat().st_size == len(big) > 4_000_000
    assert max(gaps) < 0.5, max(gaps)


async def test_discover_page_flow_repo_view_then_download_an_option(env: Env) -> None:
    dm = env.manager()
    info = await dm.hub.repo(REPO)  # with fit verdicts
    option = info.option("Q8_0")
    status = await dm.start(await dm.plan_for(info, option))
    assert status.option == "Q8_0" and status.total_bytes == option.size_bytes
    model = await dm.wait(status.id)
    assert model.quantization == "Q8_0" and dm.get(status.id).state == "completed"
    with pytest.raises(RepoRefused):
        await dm.plan_for(dataclasses.replace(info, refused="pickle weights"), option)


async def test_two_pulls_of_one_file_share_one_download(env: Env) -> None:
    # held until the second has joined: a fast transfer could otherwise end before it resolves
    gate = env.hub.hold(REPO, FILE, at=100_000)
    dm = env.manager(stall_timeout=600)
    first = asyncio.create_task(dm.pull(REPO))
    await gate.wait_async()
    await wait_for(lambda: partial_size(env) == 100_000, 60)
    joined = await dm.start(f"{REPO}/{FILE}")  # the same file named another way
    assert joined.state == "downloading" and joined.bytes_done == 100_000
    second = asyncio.create_task(dm.wait(joined.id))
    gate.open()
    a, b = await first, await second
    assert a == b
    assert len(env.hub.file_requests(REPO, FILE)) == 1
    assert len(env.library.list()) == 1


async def test_two_managers_one_file_lock_across_processes(env: Env) -> None:
    """Two DownloadManagers (as in two processes) share the file through its lock file."""
    gate = env.hub.hold(REPO, FILE, at=100_000)  # the first one holds until the other waits
    first, second = env.manager(stall_timeout=600), env.manager(stall_timeout=600)
    both = asyncio.gather(first.pull(REPO), second.pull(REPO))
    await gate.wait_async()
    await wait_for(lambda: any(e.state == "waiting" for e in env.of(ev.DownloadProgressed)), 60)
    gate.open()
    a, b = await both
    assert a.id == b.id and a.path == b.path
    assert len(env.hub.file_requests(REPO, FILE)) == 1


# -- verification --------------------------------------------------------------------------------
async def test_flipped_byte_is_a_checksum_error_and_never_listed(env: Env) -> None:
    env.hub.fault(REPO, FILE, flip=12_345)
    dm = env.manager()
    with pytest.raises(ChecksumMismatch, match="sha256"):
        await dm.pull(REPO)
    assert env.library.list() == []
    assert not (env.models / "acme" / "tiny-GGUF" / FILE).exists()
    assert env.leftovers() == []
    s = dm.list()[0]
    assert s.state == "failed" and s.error_code == "checksum_mismatch"
    assert env.of(ev.DownloadFailed)[0].code == "checksum_mismatch"
    # retry: the fault is gone, the same download succeeds from scratch
    await dm.retry(s.id)
    model = await dm.wait(s.id)
    assert model.id == "tiny-q4_k_m" and env.leftovers() == []


async def test_hub_listing_a_wrong_sha256_is_refused(env: Env) -> None:
    env.hub.repos[REPO].files[FILE].advertised_sha256 = "0" * 64
    with pytest.raises(ChecksumMismatch):
        await env.manager().pull(REPO)
    assert env.library.list() == [] and env.leftovers() == []


async def test_small_git_files_are_verified_with_their_blob_sha1(env: Env) -> None:
    env.hub.add_repo("mlx-community/tiny-4bit", mlx_files(), tags=["mlx"], library_name="mlx")
    env.hub.fault("mlx-community/tiny-4bit", "config.json", flip=3)
    with pytest.raises(ChecksumMismatch, match="config.json"):
        await env.manager().pull("mlx-community/tiny-4bit")
    assert env.library.list() == []


# -- resume ---------------------------------------------------------------------------------------
async def test_dropped_connection_resumes_from_the_byte_on_disk(env: Env) -> None:
    env.hub.fault(REPO, FILE, drop_at=200_000)
    model = await env.manager().pull(REPO)
    assert env.hub.ranges(REPO, FILE) == [None, "bytes=200000-"]
    assert Path(model.path).read_bytes() == env.data()
    stalls = env.of(ev.DownloadStalled)
    assert len(stalls) == 1 and "connection" in stalls[0].reason


async def test_server_ignoring_range_restarts_from_zero(env: Env) -> None:
    env.hub.fault(REPO, FILE, drop_at=200_000)
    env.hub.fault(REPO, FILE, ignore_range=True)  # the retry gets 200 and the whole file
    model = await env.manager().pull(REPO)
    reqs = env.hub.file_requests(REPO, FILE)
    assert [r.range for r in reqs] == [None, "bytes=200000-"]
    assert reqs[1].status == 200
    assert Path(model.path).read_bytes() == env.data()  # never appended to the first bytes


async def test_stall_is_detected_shown_and_retried(env: Env) -> None:
    env.hub.hold(REPO, FILE, at=300_000)  # never opened: only the stall timeout ends it
    model = await env.manager(stall_timeout=1.0).pull(REPO)
    assert Path(model.path).read_bytes() == env.data()
    assert env.hub.ranges(REPO, FILE) == [None, "bytes=300000-"]
    assert any(e.state == "stalled" for e in env.of(ev.DownloadProgressed))
    stall = env.of(ev.DownloadStalled)[0]
    assert "no data for 1s" in stall.reason and stall.attempt == 1


async def test_rate_limited_retries_after_retry_after(env: Env) -> None:
    env.hub.fault(REPO, FILE, status=429, retry_after=0.2)
    model = await env.manager().pull(REPO)
    assert Path(model.path).read_bytes() == env.data()
    stall = env.of(ev.DownloadStalled)[0]
    assert stall.reason == "HTTP 429" and stall.retry_in_s == pytest.approx(0.2)


async def test_gives_up_after_max_attempts(env: Env) -> None:
    from app.errors import HubUnavailable

    env.hub.fault(REPO, FILE, status=503, times=-1)
    with pytest.raises(HubUnavailable, match="3 attempts"):
        await env.manager(max_attempts=3).pull(REPO)
    assert len(env.hub.file_requests(REPO, FILE)) == 4
    assert env.library.list() == []


async def test_pause_resume_and_resume_after_quitting(env: Env) -> None:
    env.hub.hold(REPO, FILE, at=250_000)  # held until paused
    dm = env.manager(stall_timeout=600, progress_interval=0.25)
    status = await dm.start(REPO)
    await wait_for(lambda: partial_size(env) == 250_000, 60)
    # throttled progress still reports the last bytes before the connection went quiet
    progressed = env.of
    await wait_for(
        lambda: any(e.bytes_done == 250_000 for e in progressed(ev.DownloadProgressed)), 60
    )
    paused = await dm.pause(status.id)
    assert paused.state == "paused" and paused.bytes_done == 250_000
    assert env.of(ev.DownloadPaused)
    # "quit": the app closes; the partial and its sidecar stay; nothing partial is listed
    await dm.close()
    assert env.library.list() == []
    side = env.models / "acme" / "tiny-GGUF" / f".{FILE}.partial.json"
    plan = json.loads(side.read_text())["plan"]
    assert (
        plan["repo_id"] == REPO
        and plan["files"][0]["sha256"] == env.hub.repos[REPO].files[FILE].sha256
    )
    # next start: a new manager finds the partial download and resumes it from its bytes
    dm2 = env.manager()
    found = dm2.list()
    assert [(s.id, s.state, s.bytes_done) for s in found] == [(status.id, "paused", 250_000)]
    await dm2.resume(status.id)
    model = await dm2.wait(status.id)
    assert env.hub.ranges(REPO, FILE) == [None, "bytes=250000-"]
    assert Path(model.path).read_bytes() == env.data()
    assert env.leftovers() == []


async def test_what_a_crash_left_is_settled_when_found(env: Env) -> None:
    """A record with no byte to resume is removed; a download whose file was renamed into
    place before the crash (the index entry missing) is registered; neither while another
    process holds the download's lock."""
    gate = env.hub.hold(REPO, FILE, at=0)
    other = env.manager(stall_timeout=600)  # "another process", downloading at byte 0
    running = await other.start(REPO)
    await gate.wait_async()
    await wait_for(lambda: partial_size(env) == 0, 60)
    side = env.models / "acme" / "tiny-GGUF" / f".{FILE}.partial.json"
    assert [(s.id, s.state) for s in env.manager().list()] == [(running.id, "paused")]
    assert side.exists() and partial_size(env) == 0  # its files are left alone
    await other.pause(running.id)  # as a kill would leave it: record and empty partial
    assert [s.state for s in env.manager().list()] == []
    assert env.leftovers() == []
    # killed after the rename, before the index: only the record is left besides the file
    gate.open()
    model = await env.manager().pull(REPO)
    plan = (await env.manager().resolve(REPO)).to_dict()
    side.write_text(json.dumps({"version": 1, "plan": plan}))
    env.library.index_file.write_text(json.dumps({"version": 1, "models": []}))
    env.seen.clear()
    dm = env.manager()
    [s] = dm.list()
    assert (s.state, s.model_id, s.bytes_done) == ("completed", model.id, s.total_bytes)
    assert await dm.wait(s.id) == env.library.get(model.id)
    assert env.library.get(model.id).extra["hub"]["repo_id"] == REPO
    assert env.of(ev.LibraryChanged) and env.leftovers() == []


async def test_cancel_removes_partials_and_fails_waiters(env: Env) -> None:
    env.hub.hold(REPO, FILE, at=100_000)  # held until cancelled
    dm = env.manager(stall_timeout=600)
    status = await dm.start(REPO)
    waiter = asyncio.create_task(dm.wait(status.id))
    await wait_for(lambda: partial_size(env) == 100_000, 60)
    s = await dm.cancel(status.id)
    assert s.state == "cancelled"
    with pytest.raises(DownloadCancelled):
        await waiter
    assert env.leftovers() == [] and env.library.list() == []
    assert env.of(ev.DownloadCancelled)


# -- disk space -----------------------------------------------------------------------------------
async def test_not_enough_disk_is_refused_before_starting(env: Env) -> None:
    dm = env.manager(free_space=lambda _p: 10_000)
    with pytest.raises(InsufficientStorage, match="disk space"):
        await dm.pull(REPO)
    assert env.hub.file_requests(REPO, FILE) == []
    assert not env.models.exists() or env.leftovers() == []
    assert env.library.list() == []


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[SmallDisk]:
    """A real 2 MiB filesystem, mounted in this process (root). Without mounts, the e2e tests
    (tests/e2e/pull/test_pull_disk.py) still get one, in a user namespace for a Hearth process."""
    d, why = open_small_disk(tmp_path / "small-disk", 2 << 20, "mount")
    if d is None:
        pytest.skip(why)
    try:
        yield d
    finally:
        d.close()


async def test_real_small_disk_refuses_then_enospc_mid_write(
    env: Env, small_disk: SmallDisk
) -> None:
    env.hub.add_repo(
        "acme/big-GGUF", {"big-Q4_K_M.gguf": gguf_bytes(env.root / "b2", elems=800_000)}
    )
    lib = ModelLibrary(env.root / "data" / "library.json", small_disk.path / "models")
    hub = HubClient(endpoint=env.hub.endpoint)
    # the real free-space probe throughout: 3.2 MB cannot fit in 2 MiB, refused before a byte
    policy = DownloadPolicy(backoff_base=0.05, stall_timeout=600)
    dm = DownloadManager(lib, hub, env.events, policy=policy)
    with pytest.raises(InsufficientStorage, match="disk space"):
        await dm.pull("acme/big-GGUF")
    assert env.hub.file_requests("acme/big-GGUF", "big-Q4_K_M.gguf") == []
    # this one fits; the disk fills up (another program) while the Hub holds the transfer
    gate = env.hub.hold(REPO, FILE, at=100_000)
    pull = asyncio.create_task(dm.pull(REPO))
    part = small_disk.path / "models" / "acme" / "tiny-GGUF" / f".{FILE}.partial"
    await gate.wait_async()
    await wait_for(lambda: part.exists() and part.stat().st_size == 100_000, 60)
    filler = await asyncio.to_thread(small_disk.fill)
    gate.open()
    with pytest.raises(InsufficientStorage, match="filled up"):
        await pull
    left = [p.name for p in (small_disk.path / "models").rglob("*") if p.is_file()]
    assert [n for n in left if not n.endswith(".lock")] == []
    assert lib.list() == []
    # the disk is usable again: the same pull now works there
    filler.unlink()
    model = await dm.pull(REPO)
    assert Path(model.path).is_relative_to(small_disk.path)
    assert Path(model.path).read_bytes() == env.data()


# -- hostile names and symlinks ---------------------------------------------------------------------
@pytest.mark.parametrize(
    "ref",
    [
        "acme/tiny-GGUF/../x.gguf",
        "acme/tiny-GGUF//abs.gguf",
        "acme/tiny-GGUF/C:\\x.gguf",
        "acme/tiny-GGUF/\\\\server\\share\\x.gguf",
        "acme/tiny-GGUF/x\x00.gguf",
        "../../etc/passwd",
    ],
)
async def test_hostile_refs_are_refused(env: Env, ref: str) -> None:
    with pytest.raises(RepoRefused):
        await env.manager().pull(ref)
    assert not env.models.exists() or list(env.models.rglob("*")) == []


async def test_hostile_sibling_names_never_become_paths(env: Env) -> None:
    env.hub.add_repo(
        "evil/names-GGUF",
        {},
        tags=["gguf"],
        listed_only=[
            "../escape.gguf",
            "/abs.gguf",
            "C:\\x.gguf",
            "\\\\srv\\s\\x.gguf",
            "a\x00.gguf",
        ],
    )
    with pytest.raises(RepoRefused, match="unsafe"):
        await env.manager().pull("evil/names-GGUF")
    assert not (env.root / "escape.gguf").exists()
    assert not env.models.exists() or list(env.models.rglob("*.gguf")) == []


@pytest.mark.parametrize("where", ["owner-dir", "partial", "final"])
async def test_planted_symlinks_are_refused(env: Env, where: str) -> None:
    outside = env.root / "outside"
    outside.mkdir()
    victim = outside / "victim.gguf"
    victim.write_bytes(b"keep me")
    repo_dir = env.models / "acme" / "tiny-GGUF"
    if where == "owner-dir":
        env.models.mkdir(parents=True)
        (env.models / "acme").symlink_to(outside, target_is_directory=True)
    else:
        repo_dir.mkdir(parents=True)
        name = f".{FILE}.partial" if where == "partial" else FILE
        (repo_dir / name).symlink_to(victim)
    with pytest.raises(RepoRefused, match="symlink"):
        await env.manager().pull(REPO)
    assert victim.read_bytes() == b"keep me"
    assert sorted(p.name for p in outside.iterdir()) == ["victim.gguf"]
    assert env.library.list() == []


async def test_hostile_sidecar_is_ignored(env: Env) -> None:
    d = env.models / "acme" / "x"
    d.mkdir(parents=True)
    plan = {
        "repo_id": "acme/x",
        "revision": "main",
        "format": "gguf",
        "option": "Q4_K_M",
        "quantization": "Q4_K_M",
        "files": [{"path": "../../../evil.gguf", "size": 10, "sha256": "0" * 64, "blob_id": None}],
    }
    (d / ".evil.gguf.partial.json").write_text(json.dumps({"version": 1, "plan": plan}))
    assert env.manager().list() == []


# -- gated repos, MLX folders, shards -----------------------------------------------------------------
async def test_gated_repo_needs_a_token(env: Env) -> None:
    env.hub.add_repo(
        "meta/gated-GGUF",
        {"g-Q4_K_M.gguf": gguf_bytes(env.root / "g")},
        tags=["gguf"],
        gated="auto",
    )
    dm = env.manager()
    with pytest.raises(AccessDenied) as e:
        await dm.pull("meta/gated-GGUF")
    assert f"{env.hub.endpoint}/meta/gated-GGUF" in e.value.message and "token" in e.value.message
    assert dm.list() == []  # refused before anything was queued
    model = await env.manager(token=TOKEN).pull("meta/gated-GGUF")
    assert model.id == "g-q4_k_m"
    got = env.hub.file_requests("meta/gated-GGUF", "g-Q4_K_M.gguf")
    assert got and all(r.status in (200, 206) for r in got)
    resolves = [s for s in env.hub.seen if s.path.startswith("/meta/gated-GGUF/resolve/")]
    assert resolves[-1].authorization == f"Bearer {TOKEN}"


async def test_mlx_repo_downloads_as_a_folder(env: Env) -> None:
    files = mlx_files()
    env.hub.add_repo(
        "mlx-community/tiny-4bit",
        {**files, "README.md": b"# card", "modeling_x.py": b"print('never')", "weights.bin": b"x"},
        tags=["mlx"],
        library_name="mlx",
    )
    model = await env.manager().pull("mlx-community/tiny-4bit")
    folder = Path(model.path)
    assert folder == (env.models / "mlx-community" / "tiny-4bit").resolve()
    assert sorted(p.name for p in folder.iterdir()) == sorted(files)
    for name, data in files.items():
        assert (folder / name).read_bytes() == data
    assert model.format == "mlx" and model.quantization == "4bit"
    assert [(m.id, m.format) for m in env.library.list()] == [("tiny-4bit", "mlx")]
    assert env.leftovers() == []


async def test_mlx_config_asking_for_code_is_refused_after_download(env: Env) -> None:
    """The Hub's API may omit auto_map; the downloaded config.json is checked before install."""
    evil = mlx_files(config={"model_type": "x", "auto_map": {"AutoModel": "m.X"}})
    env.hub.add_repo("evil/sneaky-mlx", evil, tags=["mlx"], library_name="mlx", config={})
    with pytest.raises(RepoRefused, match="auto_map"):
        await env.manager().pull("evil/sneaky-mlx")
    assert env.library.list() == [] and env.leftovers() == []
    assert not (env.models / "evil" / "sneaky-mlx").exists()


async def test_pickle_only_and_remote_code_repos_are_refused(env: Env) -> None:
    env.hub.add_repo("acme/pickle", {"pytorch_model.bin": b"\x80\x04.", "config.json": b"{}"})
    cfg = {"model_type": "x", "auto_map": {"AutoModel": "m.X"}}
    env.hub.add_repo(
        "acme/code-mlx", mlx_files(config=cfg), tags=["mlx"], library_name="mlx", config=cfg
    )
    dm = env.manager()
    with pytest.raises(RepoRefused, match="pickle"):
        await dm.pull("acme/pickle")
    with pytest.raises(RepoRefused, match="trust_remote_code"):
        await dm.pull("acme/code-mlx")
    assert not any(s.path.endswith(".bin") for s in env.hub.seen)
    assert dm.list() == [] and env.library.list() == []


async def test_sharded_gguf_is_one_model_and_removed_whole(env: Env) -> None:
    first = gguf_bytes(env.root / "s", elems=4096)
    env.hub.add_repo(
        "acme/big-GGUF",
        {
            "Q8_0/big-Q8_0-00001-of-00002.gguf": first,
            "Q8_0/big-Q8_0-00002-of-00002.gguf": b"\1" * 50_000,
        },
        tags=["gguf"],
    )
    model = await env.manager().pull("acme/big-GGUF:Q8_0")
    d = env.models / "acme" / "big-GGUF"
    assert sorted(p.name for p in d.iterdir()) == [
        "big-Q8_0-00001-of-00002.gguf",
        "big-Q8_0-00002-of-00002.gguf",
    ]
    assert model.size_bytes == len(first) + 50_000
    assert [m.id for m in env.library.list()] == [model.id]  # one entry, not one per shard
    _, deleted = env.library.remove(model.id)
    assert deleted and not d.exists() and not (env.models / "acme").exists()


async def test_partial_files_in_the_models_folder_are_never_listed(env: Env) -> None:
    d = env.models / "acme" / "tiny-GGUF"
    d.mkdir(parents=True)
    (d / f".{FILE}.partial").write_bytes(env.data()[:1000])
    staging = env.models / "mlx-community" / ".tiny-4bit.partial"
    staging.mkdir(parents=True)
    for name, data in mlx_files().items():
        (staging / name).write_bytes(data)
    assert env.library.list() == []
    # a finished download copied in by hand (same layout) is adopted, by the background scan a
    # later listing starts (a listing never scans the folder itself)
    (d / FILE).write_bytes(env.data())
    deadline = time.monotonic() + 30
    while [m.id for m in env.library.list()] != ["tiny-q4_k_m"]:
        assert time.monotonic() < deadline, "the copied-in download was never adopted"
        await asyncio.sleep(0.05)


def test_partial_files_survive_the_library_stale_cleaner(env: Env) -> None:
    d = env.models / "acme" / "tiny-GGUF"
    d.mkdir(parents=True)
    p = d / f".{FILE}.partial"
    p.write_bytes(b"x" * 10)
    old = 1_000_000_000
    os.utime(p, (old, old))
    ModelLibrary(env.library.index_file, env.models)  # cleans stale temp files on start
    assert p.exists()  # a resumable download is not a stale temp file


@pytest.fixture(autouse=True)
async def _close_managers(env: Env) -> Any:
    yield
    for dm in env.managers:
        with contextlib.suppress(Exception):
            await dm.close()
