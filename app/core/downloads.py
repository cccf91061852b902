"""DownloadManager: pull models from the Hub into Hearth's models folder, verified and resumable.

huggingface_hub resolves repos, URLs and auth; the bytes move here, over huggingface_hub's async
HTTP client, because Hearth needs what ``hf_hub_download`` does not give it: pause, progress
events, files under its own folder, and a sha256 check (hf_hub_download accepts a flipped byte).

On disk, under the models folder (``owner/name/`` per repo):

- ``.FILE.partial``: bytes received so far; ``.TARGET.partial.json``: the plan (repo, commit,
  files, sizes, sha256) so a pull resumes after a quit or a crash (HTTP Range from the bytes on
  disk, re-hashed first); ``.TARGET.lock``: held while a process downloads (one download per file
  across processes).
- A file enters the library only after its sha256 (the LFS oid; the git blob sha1 for small
  files) matched, by a rename: nothing partial is ever listed. Sharded GGUFs rename their first
  shard last (the library lists first shards only); MLX folders are assembled in a hidden
  ``.NAME.partial/`` folder and renamed whole.
- What a crash left is settled when found: resumable bytes are listed as paused; files already
  renamed into place are registered; a record with no byte to resume is removed.

The lock file, the running hash and the raw writes are in ``app.core.download_io``.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import json
import logging
import os
import shutil
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import httpx2

from app.core.download_io import (
    BINARY,
    NOFOLLOW,
    FileLock,
    Hasher,
    disk_full,
    free_space,
    fsync_dir,
    hash_prefix,
    truncate,
    unlink_quiet,
    write_all,
)
from app.core.events import (
    DownloadCancelled as DownloadCancelledEvent,
)
from app.core.events import (
    DownloadFailed as DownloadFailedEvent,
)
from app.core.events import (
    DownloadFinished,
    DownloadPaused,
    DownloadProgressed,
    DownloadQueued,
    DownloadResumed,
    DownloadStalled,
    EventHub,
    LibraryChanged,
)
from app.core.fsutil import atomic_write_json
from app.core.hub import (
    HubClient,
    HubFormat,
    HubRef,
    ModelOption,
    RepoFile,
    RepoInfo,
    check_repo_id,
    check_repo_path,
    choose,
    parse_ref,
    remote_code_reason,
)
from app.core.library import ModelLibrary
from app.core.types import LocalModel
from app.errors import (
    ChecksumMismatch,
    DownloadCancelled,
    DownloadFailed,
    DownloadNotFound,
    HearthError,
    HubUnavailable,
    InsufficientStorage,
    RepoNotFound,
    RepoRefused,
)

log = logging.getLogger(__name__)

State = Literal[
    "queued",  # waiting for a download slot
    "waiting",  # another Hearth process is downloading the same file
    "downloading",
    "stalled",  # no bytes for the stall timeout: retrying after a backoff
    "retrying",  # the connection broke or the Hub answered 429/5xx: retrying after a backoff
    "verifying",  # re-hashing bytes on disk before resuming
    "paused",
    "completed",
    "failed",
    "cancelled",
]
ACTIVE: frozenset[str] = frozenset(
    {"queued", "waiting", "downloading", "stalled", "retrying", "verifying"}
)
SIDECAR_VERSION = 1
DISK_RESERVE = 1024 * 1024  # keep this much free beyond the download itself


# -- plans and statuses --------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class PullPlan:
    """What one download fetches: files of one repo at one commit, each with its expected hash."""

    repo_id: str
    revision: str
    format: HubFormat
    option: str  # the option's name: "Q4_K_M", a file stem, or "mlx"
    quantization: str | None
    files: tuple[RepoFile, ...]

    @property
    def key(self) -> str:
        """The download id: the same files at the same commit are one download."""
        raw = json.dumps([self.repo_id, self.revision, [f.path for f in self.files]])
        return hashlib.sha256(raw.encode()).hexdigest()[:16]

    @property
    def total_bytes(self) -> int:
        return sum(f.size or 0 for f in self.files)

    @property
    def name(self) -> str:
        if self.format == "mlx":
            return self.repo_id.split("/")[1]
        return self.files[0].path.rsplit("/", 1)[-1]

    def to_dict(self) -> dict[str, Any]:
        return {
            "repo_id": self.repo_id,
            "revision": self.revision,
            "format": self.format,
            "option": self.option,
            "quantization": self.quantization,
            "files": [
                {"path": f.path, "size": f.size, "sha256": f.sha256, "blob_id": f.blob_id}
                for f in self.files
            ],
        }

    @classmethod
    def from_dict(cls, d: Any) -> PullPlan:
        """Rebuild a plan from a sidecar, checking every name and hash again (never trusted).

        Raises:
            ValueError, RepoRefused: the sidecar is malformed or hostile.
        """
        if not isinstance(d, dict) or not isinstance(d.get("files"), list) or not d["files"]:
            raise ValueError("not a download plan")
        files = []
        for f in d["files"]:
            if not isinstance(f, dict):
                raise ValueError("bad file entry")
            size, sha, blob = f.get("size"), f.get("sha256"), f.get("blob_id")
            if not isinstance(size, int) or size < 0:
                raise ValueError("bad size")
            if sha is not None and not (isinstance(sha, str) and len(sha) == 64):
                raise ValueError("bad sha256")
            if blob is not None and not (isinstance(blob, str) and len(blob) == 40):
                raise ValueError("bad blob id")
            files.append(RepoFile(check_repo_path(str(f.get("path") or "")), size, sha, blob))
        fmt = d.get("format")
        if fmt not in ("gguf", "mlx"):
            raise ValueError("bad format")
        rev = d.get("revision")
        if not isinstance(rev, str) or not rev or "/" in rev or ".." in rev:
            raise ValueError("bad revision")
        q = d.get("quantization")
        return cls(
            repo_id=check_repo_id(d.get("repo_id", "")),
            revision=rev,
            format=fmt,
            option=str(d.get("option") or ""),
            quantization=q if isinstance(q, str) else None,
            files=tuple(files),
        )


@dataclass(frozen=True, slots=True)
class DownloadStatus:
    """A snapshot of one download, for lists, progress bars and the API."""

    id: str
    repo_id: str
    revision: str
    name: str
    option: str
    format: str
    files: tuple[str, ...]
    state: str
    bytes_done: int
    total_bytes: int
    speed_bps: float
    eta_s: float | None
    current_file: str | None
    attempt: int
    error: str | None
    error_code: str | None
    model_id: str | None
    started_at: float

    @property
    def finished(self) -> bool:
        return self.state in ("completed", "failed", "cancelled")

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "repo_id": self.repo_id,
            "revision": self.revision,
            "name": self.name,
            "option": self.option,
            "format": self.format,
            "files": list(self.files),
            "state": self.state,
            "bytes_done": self.bytes_done,
            "total_bytes": self.total_bytes,
            "speed_bps": round(self.speed_bps, 1),
            "eta_s": None if self.eta_s is None else round(self.eta_s, 1),
            "current_file": self.current_file,
            "attempt": self.attempt,
            "error": self.error,
            "error_code": self.error_code,
            "model_id": self.model_id,
        }


class _Retry(Exception):
    """A transient failure: the caller backs off and resumes from the bytes on disk."""

    def __init__(self, reason: str, *, stalled: bool = False, retry_after: float | None = None):
        super().__init__(reason)
        self.reason = reason
        self.stalled = stalled
        self.retry_after = retry_after


class _Meter:
    """Speed over the last few seconds; ETA from it."""

    def __init__(self, window: float = 3.0) -> None:
        self.window = window
        self.samples: deque[tuple[float, int]] = deque()

    def add(self, done: int) -> None:
        now = time.monotonic()
        self.samples.append((now, done))
        while len(self.samples) > 2 and now - self.samples[0][0] > self.window:
            self.samples.popleft()

    def reset(self) -> None:
        self.samples.clear()

    def speed(self) -> float:
        if len(self.samples) < 2:
            return 0.0
        (t0, b0), (t1, b1) = self.samples[0], self.samples[-1]
        if time.monotonic() - t1 > self.window:  # nothing arrived lately
            return 0.0
        return (b1 - b0) / (t1 - t0) if t1 > t0 else 0.0


class _Job:
    def __init__(self, plan: PullPlan, target: Path) -> None:
        self.plan = plan
        self.id = plan.key
        self.target = target
        self.state: str = "queued"
        self.have: dict[str, int] = {f.path: 0 for f in plan.files}
        self.current_file: str | None = None
        self.attempt = 0
        self.error: HearthError | None = None
        self.model: LocalModel | None = None
        self.task: asyncio.Task[None] | None = None
        self.future: asyncio.Future[LocalModel] | None = None
        self.intent: str | None = None  # "pause" | "cancel" while stopping the task
        self.meter = _Meter()
        self.started_at = time.time()
        self.last_publish = 0.0
        self.pending_publish: asyncio.TimerHandle | None = None
        self.watchers: list[asyncio.Queue[DownloadStatus]] = []

    @property
    def bytes_done(self) -> int:
        return sum(self.have.values())

    def status(self) -> DownloadStatus:
        speed = self.meter.speed() if self.state == "downloading" else 0.0
        left = self.plan.total_bytes - self.bytes_done
        return DownloadStatus(
            id=self.id,
            repo_id=self.plan.repo_id,
            revision=self.plan.revision,
            name=self.plan.name,
            option=self.plan.option,
            format=self.plan.format,
            files=tuple(f.path for f in self.plan.files),
            state=self.state,
            bytes_done=self.bytes_done,
            total_bytes=self.plan.total_bytes,
            speed_bps=speed,
            eta_s=left / speed if speed > 0 else None,
            current_file=self.current_file,
            attempt=self.attempt,
            error=self.error.message if self.error else None,
            error_code=self.error.code if self.error else None,
            model_id=self.model.id if self.model else None,
            started_at=self.started_at,
        )

    def new_future(self) -> asyncio.Future[LocalModel]:
        fut: asyncio.Future[LocalModel] = asyncio.get_running_loop().create_future()
        # a failure nobody waits for is still reported through events; don't warn about it
        fut.add_done_callback(lambda f: f.cancelled() or f.exception())
        self.future = fut
        return fut


class DownloadManager:
    """The download queue. Lives on the service loop; every coroutine runs there.

    Args:
        library: where finished models are registered (its ``models_dir`` receives the files).
        hub: resolves references and provides URLs, auth headers and the HTTP client.
        events: receives Download* events and LibraryChanged.
        free_space: bytes free at a path (tests inject a small disk).
        stall_timeout: seconds without a byte before a connection counts as stalled.
        max_attempts: consecutive failed attempts (without progress) before a download fails.
        max_concurrent: downloads running at once; the rest wait as "queued".
    """

    def __init__(
        self,
        library: ModelLibrary,
        hub: HubClient,
        events: EventHub,
        *,
        free_space: Callable[[Path], int] = free_space,
        stall_timeout: float = 30.0,
        max_attempts: int = 6,
        backoff_base: float = 1.0,
        backoff_max: float = 30.0,
        max_concurrent: int = 2,
        progress_interval: float = 0.25,
        lock_poll: float = 0.5,
    ) -> None:
        self.library = library
        self.hub = hub
        self.events = events
        self.free_space = free_space
        self.stall_timeout = stall_timeout
        self.max_attempts = max_attempts
        self.backoff_base = backoff_base
        self.backoff_max = backoff_max
        self.max_concurrent = max_concurrent
        self.progress_interval = progress_interval
        self.lock_poll = lock_poll
        self._jobs: dict[str, _Job] = {}
        self._slots: asyncio.Semaphore | None = None
        self._scanned = False

    @property
    def models_dir(self) -> Path:
        return self.library.models_dir

    # -- public API ------------------------------------------------------------------------------
    async def resolve(self, ref: str | HubRef) -> PullPlan:
        """Turn ``REPO``, ``REPO:QUANT``, ``REPO/FILE`` or a Hub URL into a plan (nothing written).

        Raises:
            RepoRefused: hostile names, pickle-only or remote-code repos, unverifiable files.
            AmbiguousChoice: several quantizations and none named (``choices`` lists them).
            RepoNotFound, AccessDenied, HubUnavailable.
        """
        r = parse_ref(ref, endpoint=self.hub.endpoint) if isinstance(ref, str) else ref
        info = await self.hub.repo(r.repo_id, revision=r.revision, with_fit=False)
        return await self.plan_for(info, choose(info, quant=r.quant, filename=r.filename))

    async def plan_for(self, info: RepoInfo, opt: ModelOption) -> PullPlan:
        """A plan for one option of a repo view (what the Discover page's Download button does).

        Raises:
            RepoRefused: the repo is refused, or a file has no size or checksum to verify.
            AccessDenied: a gated or private repo the token cannot read.
        """
        if info.refused:
            raise RepoRefused(f"{info.id}: {info.refused}")
        if not any(o.name == opt.name and o.files == opt.files for o in info.options):
            raise RepoRefused(f"{info.id} does not offer {opt.name}")
        for f in opt.files:
            check_repo_path(f.path)
            if f.size is None:
                raise RepoRefused(f"{info.id}: the Hub does not give the size of {f.path}")
            if not (f.sha256 or f.blob_id):
                raise RepoRefused(
                    f"{info.id}: the Hub gives no checksum for {f.path}, so it cannot be verified"
                )
            if f.path.lower().endswith((".gguf", ".safetensors")) and not f.sha256:
                raise RepoRefused(f"{info.id}: {f.path} is not in LFS (no sha256 to verify it)")
        if info.gated or info.private:
            await self.hub.check_access(info.id, opt.first_file.path, revision=info.revision)
        return PullPlan(info.id, info.revision, opt.format, opt.name, opt.quantization, opt.files)

    async def start(self, ref: str | HubRef | PullPlan) -> DownloadStatus:
        """Queue a download (or join the one already running for the same files)."""
        plan = ref if isinstance(ref, PullPlan) else await self.resolve(ref)
        return self._submit(plan).status()

    async def pull(self, ref: str | HubRef | PullPlan) -> LocalModel:
        """Download and install; returns the library entry. Two pulls of one file share one
        download and both get the model.

        Raises:
            everything ``resolve`` raises; ChecksumMismatch, InsufficientStorage, AccessDenied,
            HubUnavailable (gave up retrying), DownloadCancelled, DownloadFailed.
        """
        plan = ref if isinstance(ref, PullPlan) else await self.resolve(ref)
        job = self._submit(plan)
        return await self.wait(job.id)

    async def wait(self, download_id: str) -> LocalModel:
        """Wait for a download to finish (through pauses). Raises its error."""
        job = self._job(download_id)
        if job.future is None and job.state == "completed" and job.model is not None:
            return job.model  # finished when found on disk (see _settle_found)
        fut = job.future or job.new_future()
        # shielded: a waiter that gives up (a closed HTTP stream) does not stop the download
        return await asyncio.shield(fut)

    def list(self) -> list[DownloadStatus]:
        """Every download this process knows: running, queued, paused (including partial
        downloads found on disk from an earlier run or a crash), finished."""
        self._scan_partials()
        return sorted((j.status() for j in self._jobs.values()), key=lambda s: s.started_at)

    def get(self, download_id: str) -> DownloadStatus:
        self._scan_partials()
        return self._job(download_id).status()

    async def watch(self, download_id: str) -> AsyncIterator[DownloadStatus]:
        """Status snapshots of one download, from now until it completes, fails or is cancelled."""
        job = self._job(download_id)
        q: asyncio.Queue[DownloadStatus] = asyncio.Queue()
        job.watchers.append(q)
        try:
            current = job.status()
            yield current
            if current.finished and (job.task is None or job.task.done()):
                return
            while True:
                s = await q.get()
                yield s
                if s.finished:
                    return
        finally:
            with contextlib.suppress(ValueError):
                job.watchers.remove(q)

    async def pause(self, download_id: str) -> DownloadStatus:
        """Stop transferring and keep the bytes; ``resume`` continues from them."""
        job = self._job(download_id)
        if job.state in ACTIVE and job.task is not None and not job.task.done():
            job.intent = "pause"
            job.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await job.task
            if job.state in ACTIVE:  # cancelled before it ever ran
                self._set_state(job, "paused")
        return job.status()

    async def resume(self, download_id: str) -> DownloadStatus:
        """Continue a paused download (or one found on disk) from its bytes on disk."""
        self._scan_partials()
        job = self._job(download_id)
        if job.state == "paused":
            self._launch(job)
            self.events.publish(DownloadResumed(download_id=job.id))
        return job.status()

    async def retry(self, download_id: str) -> DownloadStatus:
        """Start a failed or cancelled download again (resuming from any bytes left on disk)."""
        job = self._job(download_id)
        if job.state in ("failed", "cancelled", "paused"):
            self._launch(job)
        return job.status()

    async def cancel(self, download_id: str) -> DownloadStatus:
        """Stop and delete the partial files. A waiting ``pull`` raises DownloadCancelled."""
        self._scan_partials()
        job = self._job(download_id)
        if job.task is not None and not job.task.done():
            job.intent = "cancel"
            job.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await job.task
            if job.state not in ("cancelled", "completed"):  # cancelled before it ever ran
                await self._discard_locked(job)
                self._set_cancelled(job)
        elif job.state in ("paused", "failed"):
            await self._discard_locked(job)
            self._set_cancelled(job)
        return job.status()

    async def _discard_locked(self, job: _Job) -> None:
        """Delete a stopped download's partial files, unless another process is using them."""
        lock = FileLock(self._lock_path(job))
        try:
            got = lock.try_acquire()
        except OSError:
            return
        if not got:
            log.info("download %s: another process holds its files; not deleting them", job.id)
            return
        try:
            await asyncio.to_thread(self._discard, job)
        finally:
            lock.release(unlink=True)

    def clear_finished(self) -> None:
        """Forget completed, failed and cancelled downloads (the list shows the rest)."""
        for k in [
            k for k, j in self._jobs.items() if j.state in ("completed", "failed", "cancelled")
        ]:
            del self._jobs[k]

    async def close(self) -> None:
        """Pause every running download (their partial files stay, resumable next time)."""
        tasks = []
        for job in self._jobs.values():
            if job.task is not None and not job.task.done():
                job.intent = "pause"
                job.task.cancel()
                tasks.append(job.task)
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    # -- jobs ------------------------------------------------------------------------------------
    def _job(self, download_id: str) -> _Job:
        job = self._jobs.get(download_id)
        if job is None:
            raise DownloadNotFound(f"no download '{download_id}'", param="id")
        return job

    def _submit(self, plan: PullPlan) -> _Job:
        job = self._jobs.get(plan.key)
        if job is not None and job.state in ACTIVE and job.task is not None and not job.task.done():
            return job  # the same files are already coming: share that download
        if job is None:
            job = _Job(plan, self._target(plan))
            self._jobs[job.id] = job
            self.events.publish(
                DownloadQueued(
                    download_id=job.id,
                    repo_id=plan.repo_id,
                    name=plan.name,
                    total_bytes=plan.total_bytes,
                )
            )
        self._launch(job)
        return job

    def _launch(self, job: _Job) -> None:
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.max_concurrent)
        job.intent = None
        job.error = None
        job.attempt = 0
        if job.future is None or job.future.done():
            job.new_future()
        self._set_state(job, "queued")
        job.task = asyncio.create_task(self._run(job), name=f"download-{job.id}")

    async def _run(self, job: _Job) -> None:
        fut = job.future
        try:
            if self._slots is None:  # pragma: no cover - _launch creates it
                self._slots = asyncio.Semaphore(self.max_concurrent)
            async with self._slots:
                model = await self._execute(job)
        except asyncio.CancelledError:
            if job.intent == "pause":
                self._set_state(job, "paused")
                self.events.publish(DownloadPaused(download_id=job.id, bytes_done=job.bytes_done))
                return
            if job.intent == "cancel":
                await self._discard_locked(job)
                self._set_cancelled(job)
                return
            raise
        except HearthError as e:
            self._fail(job, e)
            return
        except Exception as e:  # our bug: keep the service alive, report it
            log.exception("download %s failed unexpectedly", job.id)
            self._fail(job, DownloadFailed(f"download failed: {e}"))
            return
        job.model = model
        self._set_state(job, "completed", force=True)
        if fut is not None and not fut.done():
            fut.set_result(model)
        self.events.publish(LibraryChanged())
        self.events.publish(
            DownloadFinished(download_id=job.id, model_id=model.id, path=model.path)
        )
        log.info("download %s: installed %s as %s", job.id, job.plan.name, model.id)

    def _fail(self, job: _Job, e: HearthError) -> None:
        log.info("download %s (%s) failed: %s", job.id, job.plan.name, e.message)
        job.error = e
        self._set_state(job, "failed", force=True)
        if job.future is not None and not job.future.done():
            job.future.set_exception(e)
        self.events.publish(DownloadFailedEvent(download_id=job.id, message=e.message, code=e.code))

    def _set_cancelled(self, job: _Job) -> None:
        job.error = DownloadCancelled(f"the download of {job.plan.name} was cancelled")
        self._set_state(job, "cancelled", force=True)
        if job.future is not None and not job.future.done():
            job.future.set_exception(job.error)
        self.events.publish(DownloadCancelledEvent(download_id=job.id))

    def _set_state(self, job: _Job, state: str, *, force: bool = True) -> None:
        job.state = state
        self._progress(job, force=force)

    def _progress(self, job: _Job, *, force: bool = False) -> None:
        now = time.monotonic()
        wait = self.progress_interval - (now - job.last_publish)
        if not force and wait > 0:
            # throttled: publish the latest numbers soon, even if no more bytes come (a stall)
            if job.pending_publish is None:
                job.pending_publish = asyncio.get_running_loop().call_later(
                    wait, self._flush_progress, job
                )
            return
        if job.pending_publish is not None:
            job.pending_publish.cancel()
            job.pending_publish = None
        job.last_publish = now
        s = job.status()
        for q in job.watchers:
            q.put_nowait(s)
        self.events.publish(
            DownloadProgressed(
                download_id=s.id,
                state=s.state,
                bytes_done=s.bytes_done,
                total_bytes=s.total_bytes,
                speed_bps=s.speed_bps,
                eta_s=s.eta_s,
                file=s.current_file or "",
            )
        )

    def _flush_progress(self, job: _Job) -> None:
        job.pending_publish = None
        if job.state in ACTIVE:
            self._progress(job, force=True)

    # -- layout ----------------------------------------------------------------------------------
    def _repo_dir(self, plan: PullPlan) -> Path:
        owner, name = check_repo_id(plan.repo_id).split("/")
        return self.models_dir / owner / name

    def _target(self, plan: PullPlan) -> Path:
        """The file (first shard) or MLX folder the library will list."""
        base = self._repo_dir(plan)
        if plan.format == "mlx":
            return base
        return base / plan.files[0].path.rsplit("/", 1)[-1]

    def _staging(self, job: _Job) -> Path:
        """Where the files land before install: beside the target (GGUF) or a hidden folder (MLX)."""
        if job.plan.format == "mlx":
            return job.target.parent / f".{job.target.name}.partial"
        return job.target.parent

    def _final(self, job: _Job, f: RepoFile) -> Path:
        if job.plan.format == "mlx":
            return self._staging(job) / f.path
        return job.target.parent / f.path.rsplit("/", 1)[-1]

    @staticmethod
    def _partial(final: Path) -> Path:
        return final.parent / f".{final.name}.partial"

    def _sidecar(self, job: _Job) -> Path:
        return job.target.parent / f".{job.target.name}.partial.json"

    def _lock_path(self, job: _Job) -> Path:
        return job.target.parent / f".{job.target.name}.lock"

    def _safe_dir(self, folder: Path) -> None:
        """Create ``folder`` under the models folder, refusing symlinks on the way."""
        root = self.models_dir
        root.mkdir(parents=True, exist_ok=True)
        rel = folder.relative_to(root)
        cur = root
        for part in rel.parts:
            cur = cur / part
            if cur.is_symlink():
                raise RepoRefused(f"refusing to write through a symlink: {cur}")
            with contextlib.suppress(FileExistsError):
                cur.mkdir()
            if cur.is_symlink() or not cur.is_dir():
                raise RepoRefused(f"refusing to write to {cur}: not a plain folder")
        if not folder.resolve().is_relative_to(root.resolve()):
            raise RepoRefused(f"refusing to write outside the models folder: {folder}")

    def _check_not_symlink(self, p: Path) -> None:
        if p.is_symlink():
            raise RepoRefused(f"refusing to write through a symlink: {p}")

    # -- the download ----------------------------------------------------------------------------
    async def _execute(self, job: _Job) -> LocalModel:
        # refuse before creating anything when the disk cannot hold what is left to fetch
        await asyncio.to_thread(self._measure, job)
        await self._check_space(job)
        await asyncio.to_thread(self._prepare_dirs, job)
        lock = FileLock(self._lock_path(job))
        # try_acquire never blocks (LOCK_NB); on the loop, a cancellation can't strand a held lock
        while not lock.try_acquire():
            if job.state != "waiting":
                log.info("download %s: another process is downloading %s", job.id, job.plan.name)
                self._set_state(job, "waiting")
            await asyncio.sleep(self.lock_poll)
        done = False
        try:
            if await asyncio.to_thread(self._installed, job):
                model = await asyncio.to_thread(self._register, job)
                await asyncio.to_thread(self._remove_sidecar, job)
                done = True
                return model
            await asyncio.to_thread(self._measure, job)
            await self._check_space(job)
            await asyncio.to_thread(self._write_sidecar, job)
            self._set_state(job, "downloading")
            try:
                for f in job.plan.files:
                    await self._transfer(job, f)
            except ChecksumMismatch:
                if job.bytes_done == 0:  # nothing left to resume: no record of it either
                    await asyncio.to_thread(self._remove_sidecar, job)
                raise
            except OSError as e:
                if disk_full(e):
                    await asyncio.to_thread(self._discard, job)
                    raise InsufficientStorage(
                        f"The disk filled up while downloading {job.plan.name}; the partial "
                        f"download was removed. Free some space and try again."
                    ) from e
                raise DownloadFailed(f"cannot write {job.plan.name}: {e.strerror or e}") from e
            self._set_state(job, "verifying")
            # renames and registration run to the end even if a pause or cancel arrives now
            install = asyncio.ensure_future(asyncio.to_thread(self._install, job))
            try:
                try:
                    model = await asyncio.shield(install)
                except asyncio.CancelledError:
                    model = await install  # installed after all: report it as done
                    job.intent = None
            except OSError as e:
                # the verified files stay (and their record): pulling again only registers them
                if disk_full(e):
                    raise InsufficientStorage(
                        f"The disk filled up while adding {job.plan.name} to the library; the "
                        f"verified download is kept. Free some space and pull it again to finish "
                        f"(nothing is downloaded again)."
                    ) from e
                raise DownloadFailed(f"cannot install {job.plan.name}: {e.strerror or e}") from e
            done = True
            return model
        finally:
            lock.release(unlink=done)

    async def _check_space(self, job: _Job) -> None:
        needed = job.plan.total_bytes - job.bytes_done + DISK_RESERVE
        free = await asyncio.to_thread(self.free_space, job.target.parent)
        if free < needed:
            raise InsufficientStorage(
                f"Not enough disk space for {job.plan.name}: it needs {_mb(needed)} and "
                f"{_mb(free)} are free in {self.models_dir}."
            )

    def _prepare_dirs(self, job: _Job) -> None:
        self._safe_dir(job.target.parent)
        if job.plan.format == "mlx":
            staging = self._staging(job)
            self._check_not_symlink(staging)
            with contextlib.suppress(FileExistsError):
                staging.mkdir()
            for f in job.plan.files:
                if "/" in f.path:
                    self._safe_dir(self._final(job, f).parent)
        for f in job.plan.files:
            final = self._final(job, f)
            self._check_not_symlink(self._partial(final))
            if final.is_symlink():
                raise RepoRefused(f"refusing to replace a symlink: {final}")
        for p in (self._sidecar(job), self._lock_path(job)):
            self._check_not_symlink(p)

    def _installed(self, job: _Job) -> bool:
        """True when every file is already in place (a finished earlier pull)."""
        if job.plan.format == "mlx":
            t = job.target
            return (
                t.is_dir()
                and not t.is_symlink()
                and all(
                    (t / f.path).is_file() and (t / f.path).stat().st_size == f.size
                    for f in job.plan.files
                )
            )
        for f in job.plan.files:
            final = self._final(job, f)
            if final.is_symlink() or not final.is_file() or final.stat().st_size != f.size:
                return False
            if self._partial(final).exists():
                return False
        return True

    def _measure(self, job: _Job) -> None:
        for f in job.plan.files:
            final = self._final(job, f)
            part = self._partial(final)
            if part.exists():
                job.have[f.path] = min(part.lstat().st_size, f.size or 0)
            elif final.is_file() and final.stat().st_size == f.size:
                job.have[f.path] = f.size or 0
            else:
                job.have[f.path] = 0

    def _write_sidecar(self, job: _Job) -> None:
        path = self._sidecar(job)
        data: dict[str, Any] = {}
        with contextlib.suppress(OSError, ValueError):
            data = json.loads(path.read_text())
        if not isinstance(data, dict) or data.get("plan") != job.plan.to_dict():
            data = {"version": SIDECAR_VERSION, "plan": job.plan.to_dict(), "etags": {}}
        data["updated_at"] = time.time()
        atomic_write_json(path, data)

    def _sidecar_etag(self, job: _Job, path: str, etag: str | None = None) -> str | None:
        """Read (or, with ``etag``, record) the ETag a file's partial bytes came with."""
        side = self._sidecar(job)
        try:
            data = json.loads(side.read_text())
        except (OSError, ValueError):
            data = {"version": SIDECAR_VERSION, "plan": job.plan.to_dict(), "etags": {}}
        etags = data.setdefault("etags", {})
        if etag is None:
            v = etags.get(path)
            return v if isinstance(v, str) else None
        etags[path] = etag
        atomic_write_json(side, data)
        return etag

    def _remove_sidecar(self, job: _Job) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._sidecar(job).unlink()

    def _discard(self, job: _Job) -> None:
        """Delete this download's partial files (never a finished file outside staging)."""
        for f in job.plan.files:
            with contextlib.suppress(FileNotFoundError):
                self._partial(self._final(job, f)).unlink()
        if job.plan.format == "mlx":
            staging = self._staging(job)
            if staging.is_dir() and not staging.is_symlink():
                shutil.rmtree(staging, ignore_errors=True)
        self._remove_sidecar(job)
        for f in job.plan.files:
            job.have[f.path] = 0

    async def _transfer(self, job: _Job, f: RepoFile) -> None:
        """Bring one file to a verified ``.partial`` (or leave an already verified final)."""
        final = self._final(job, f)
        part = self._partial(final)
        size = f.size or 0
        job.current_file = f.path
        if not part.exists() and final.is_file() and not final.is_symlink():
            if final.stat().st_size == size:  # verified and renamed before a crash
                job.have[f.path] = size
                return
        hasher = Hasher(f)
        have = 0
        if part.exists():
            self._check_not_symlink(part)
            have = part.lstat().st_size
            if have > size:
                await asyncio.to_thread(truncate, part)
                have = 0
        if have:
            self._set_state(job, "verifying")
            await asyncio.to_thread(hash_prefix, part, have, hasher)
        job.have[f.path] = have
        self._set_state(job, "downloading")
        job.meter.reset()
        failures = 0
        while job.have[f.path] < size:
            before = job.have[f.path]
            try:
                await self._stream(job, f, part, hasher)
                if job.have[f.path] < size:
                    raise _Retry("the connection closed before the end of the file")
            except _Retry as e:
                failures = 1 if job.have[f.path] > before else failures + 1
                job.attempt = failures
                if failures > self.max_attempts:
                    raise HubUnavailable(
                        f"giving up on {f.path} after {self.max_attempts} attempts: {e.reason}"
                    ) from e
                delay = e.retry_after
                if delay is None:
                    delay = min(self.backoff_max, self.backoff_base * 2 ** (failures - 1))
                log.warning(
                    "download %s: %s (%s); retry %d in %.1fs",
                    job.id,
                    f.path,
                    e.reason,
                    failures,
                    delay,
                )
                self._set_state(job, "stalled" if e.stalled else "retrying")
                self.events.publish(
                    DownloadStalled(
                        download_id=job.id, attempt=failures, retry_in_s=delay, reason=e.reason
                    )
                )
                await asyncio.sleep(delay)
                self._set_state(job, "downloading")
        if not hasher.matches():
            await asyncio.to_thread(unlink_quiet, part)
            job.have[f.path] = 0
            raise ChecksumMismatch(
                f"{f.path} from {job.plan.repo_id} failed verification: its sha256 is not the "
                f"one the Hub lists ({hasher.expected[:12]}…). The download was discarded."
            )
        job.attempt = 0

    async def _stream(self, job: _Job, f: RepoFile, part: Path, hasher: Hasher) -> None:
        """One HTTP request: append to ``part`` from the bytes it has. Transient trouble: _Retry."""
        size = f.size or 0
        url = self.hub.file_url(job.plan.repo_id, f.path, job.plan.revision)
        have = job.have[f.path]
        headers = {**self.hub.headers(), "Accept-Encoding": "identity"}
        if have:
            headers["Range"] = f"bytes={have}-"
        timeout = httpx2.Timeout(self.stall_timeout)
        try:
            async with self.hub.http() as client:
                async with client.stream("GET", url, headers=headers, timeout=timeout) as r:
                    st = r.status_code
                    if st in (401, 403):
                        raise self.hub.access_error(job.plan.repo_id, st)
                    if st == 404:
                        raise RepoNotFound(f"{job.plan.repo_id}: {f.path} is not on the Hub")
                    if st == 416 or st == 408 or st == 429 or st >= 500:
                        if st == 416:  # our bytes don't fit the file: start over
                            await asyncio.to_thread(truncate, part)
                            job.have[f.path] = 0
                            hasher.reset()
                        raise _Retry(f"HTTP {st}", retry_after=_retry_after(r.headers))
                    if st not in (200, 206):
                        raise DownloadFailed(f"the Hub answered HTTP {st} for {f.path}")
                    etag = _etag(r.headers)
                    restart = have > 0 and st == 200
                    if restart:
                        log.warning(
                            "download %s: the server ignored Range for %s; restarting from zero",
                            job.id,
                            f.path,
                        )
                    if st == 206:
                        start, total = _content_range(r.headers.get("content-range"))
                        if total is not None and total != size:
                            raise DownloadFailed(
                                f"{f.path}: the server's file has {total} bytes, the Hub lists {size}"
                            )
                        if start != have:
                            await asyncio.to_thread(truncate, part)
                            job.have[f.path] = 0
                            hasher.reset()
                            raise _Retry(f"the server sent bytes from {start}, not {have}")
                    elif st == 200:
                        length = r.headers.get("content-length")
                        if length is not None and length.isdigit() and int(length) != size:
                            raise DownloadFailed(
                                f"{f.path}: the server sends {length} bytes, the Hub lists {size}"
                            )
                    if have and not restart and etag:
                        seen = await asyncio.to_thread(self._sidecar_etag, job, f.path)
                        if seen and seen != etag:
                            log.warning(
                                "download %s: %s changed on the server; restarting", job.id, f.path
                            )
                            await asyncio.to_thread(truncate, part)
                            job.have[f.path] = 0
                            hasher.reset()
                            raise _Retry("the file changed on the server")
                    if etag:
                        await asyncio.to_thread(self._sidecar_etag, job, f.path, etag)
                    if restart:
                        hasher.reset()
                        job.have[f.path] = 0
                    await self._receive(job, f, part, r, hasher, truncate=job.have[f.path] == 0)
        except httpx2.TimeoutException as e:
            raise _Retry(f"no data for {self.stall_timeout:g}s", stalled=True) from e
        except httpx2.TransportError as e:
            raise _Retry(f"connection error: {e or type(e).__name__}") from e

    async def _receive(
        self,
        job: _Job,
        f: RepoFile,
        part: Path,
        r: httpx2.Response,
        hasher: Hasher,
        *,
        truncate: bool,
    ) -> None:
        size = f.size or 0
        flags = os.O_WRONLY | os.O_CREAT | NOFOLLOW | BINARY | (os.O_TRUNC if truncate else 0)
        try:
            fd = os.open(part, flags, 0o644)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise RepoRefused(f"refusing to write through a symlink: {part}") from e
            raise
        loop = asyncio.get_running_loop()
        pending: asyncio.Future[None] | None = None
        try:
            os.lseek(fd, job.have[f.path], os.SEEK_SET)
            async for chunk in r.aiter_bytes():
                if not chunk:
                    continue
                if job.have[f.path] + len(chunk) > size:
                    raise DownloadFailed(f"{f.path}: the server sent more bytes than the file has")
                pending = loop.run_in_executor(None, write_all, fd, chunk, hasher)
                await asyncio.shield(pending)
                pending = None
                job.have[f.path] += len(chunk)
                job.meter.add(job.bytes_done)
                self._progress(job)
        finally:
            if pending is not None:  # cancelled mid-write: let the write finish before closing
                with contextlib.suppress(BaseException):
                    await pending
            os.close(fd)

    # -- install ---------------------------------------------------------------------------------
    def _install(self, job: _Job) -> LocalModel:
        plan = job.plan
        if plan.format == "gguf":
            files = list(plan.files)
            for f in files[1:] + files[:1]:  # the first shard (what the library lists) last
                final = self._final(job, f)
                part = self._partial(final)
                if part.exists():
                    os.replace(part, final)
            fsync_dir(job.target.parent)
        else:
            staging = self._staging(job)
            for f in plan.files:
                final = self._final(job, f)
                part = self._partial(final)
                if part.exists():
                    os.replace(part, final)
            why = _local_remote_code(staging)
            if why:
                shutil.rmtree(staging, ignore_errors=True)
                self._remove_sidecar(job)
                raise RepoRefused(f"refusing {plan.repo_id}: {why}")
            target = job.target
            if target.exists():  # an earlier pull of this repo: swap it out
                old = target.parent / f".{target.name}.old-{os.getpid()}"
                os.replace(target, old)
                os.replace(staging, target)
                shutil.rmtree(old, ignore_errors=True)
            else:
                os.replace(staging, target)
            fsync_dir(target.parent)
        model = self._register(job)
        self._remove_sidecar(job)
        return model

    def _register(self, job: _Job) -> LocalModel:
        plan = job.plan
        return self.library.add_downloaded(
            job.target,
            source={
                "repo_id": plan.repo_id,
                "revision": plan.revision,
                "option": plan.option,
                "files": [f.path for f in plan.files],
                "sha256": {f.path: f.sha256 for f in plan.files if f.sha256},
            },
        )

    # -- partial downloads left on disk ----------------------------------------------------------
    def _scan_partials(self) -> None:
        """Adopt sidecars of downloads that a quit or a crash interrupted: listed as paused."""
        if self._scanned:
            return
        self._scanned = True
        root = self.models_dir
        if not root.is_dir():
            return
        for side in list(root.glob("*/.*.partial.json")) + list(root.glob("*/*/.*.partial.json")):
            if side.is_symlink():
                continue
            try:
                data = json.loads(side.read_text())
                plan = PullPlan.from_dict(data.get("plan") if isinstance(data, dict) else None)
            except (OSError, ValueError, HearthError) as e:
                log.warning("ignoring a malformed download record %s: %s", side, e)
                continue
            if plan.key in self._jobs:
                continue
            job = _Job(plan, self._target(plan))
            if self._sidecar(job) != side:
                log.warning("ignoring a download record in the wrong place: %s", side)
                continue
            try:
                self._measure(job)
            except OSError:
                continue
            job.state = "paused"
            with contextlib.suppress(OSError):
                job.started_at = side.stat().st_mtime
            if self._settle_found(job):
                self._jobs[job.id] = job

    def _settle_found(self, job: _Job) -> bool:
        """Settle what a crash left of a download (unless another process is running it):
        files all in place (killed before the index was written) -> registered, completed; no
        byte to resume -> its record removed; else paused. False: nothing left to list."""
        lock = FileLock(self._lock_path(job))
        try:
            if not lock.try_acquire():
                return True
        except OSError:
            return True
        settled = False
        try:
            if self._installed(job):
                try:
                    job.model = self._register(job)
                except HearthError as e:
                    log.warning("download %s: cannot register %s: %s", job.id, job.target, e)
                    return True
                self._remove_sidecar(job)
                job.state = "completed"
                settled = True
                log.info("download %s: finished installing %s", job.id, job.model.id)
                self.events.publish(LibraryChanged())
                return True
            if job.bytes_done == 0:
                self._discard(job)
                settled = True
                log.info("download %s: nothing on disk to resume; its record is removed", job.id)
                return False
            return True
        finally:
            lock.release(unlink=settled)


# -- helpers -------------------------------------------------------------------------------------
def _etag(headers: Any) -> str | None:
    v = headers.get("x-linked-etag") or headers.get("etag")
    if not v:
        return None
    v = v.strip()
    if v.startswith("W/"):
        v = v[2:]
    return v.strip('"') or None


def _content_range(v: str | None) -> tuple[int, int | None]:
    """``bytes START-END/TOTAL`` -> (START, TOTAL or None); anything else -> (-1, None)."""
    if not v or not v.startswith("bytes "):
        return -1, None
    rng, _, total = v[6:].partition("/")
    start, _, _ = rng.partition("-")
    try:
        return int(start), (int(total) if total.strip().isdigit() else None)
    except ValueError:
        return -1, None


def _retry_after(headers: Any) -> float | None:
    v = headers.get("retry-after")
    if v is None:
        return None
    try:
        return max(0.0, min(float(v), 120.0))
    except ValueError:
        return None


def _local_remote_code(folder: Path) -> str | None:
    """The downloaded config itself (not only what the Hub's API said) must not ask for code."""
    for name in ("config.json", "tokenizer_config.json"):
        p = folder / name
        if not p.is_file():
            continue
        try:
            cfg = json.loads(p.read_text())
        except (OSError, ValueError):
            return f"{name} is not valid JSON"
        why = remote_code_reason(cfg)
        if why:
            return f"{name}: {why}"
    return None


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"
