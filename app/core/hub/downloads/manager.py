"""DownloadManager: pull models from the Hub into Hearth's models folder, verified and resumable.

The queue, its states and events live here; the plan in ``plan``, the bytes in ``transfer``, the
files on disk in ``layout`` (and, per format, ``app.core.library.formats``).

- A file enters the library only after its sha256 (the LFS oid; the git blob sha1 for small
  files) matched, by a rename: nothing partial is ever listed.
- What a crash left is settled when found: resumable bytes are listed as paused; files already
  renamed into place are registered; a record with no byte to resume is removed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

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
    EventHub,
    LibraryChanged,
)
from app.core.hub import (
    HubClient,
    HubRef,
    ModelOption,
    RepoInfo,
    choose,
    parse_ref,
)
from app.core.hub.downloads.files import FileLock, disk_full, free_space
from app.core.library.index import ModelLibrary
from app.core.types import LocalModel
from app.errors import (
    ChecksumMismatch,
    DownloadCancelled,
    DownloadFailed,
    DownloadNotFound,
    HearthError,
    InsufficientStorage,
)

from .job import Job
from .layout import DiskLayout
from .plan import ACTIVE, DownloadStatus, PullPlan
from .recovery import found_jobs
from .transfer import Transfers

log = logging.getLogger(__name__)

DISK_RESERVE = 1024 * 1024  # keep this much free beyond the download itself


@dataclass(frozen=True)
class DownloadPolicy:
    """How downloads are paced and retried.

    Attributes:
        stall_timeout: seconds without a byte before a connection counts as stalled.
        max_attempts: consecutive failed attempts (without progress) before a download fails.
        backoff_base, backoff_max: the retry delay doubles from ``backoff_base`` up to this.
        max_concurrent: downloads running at once; the rest wait as "queued".
        progress_interval: seconds between two progress events of one download.
        lock_poll: how often a download another process holds is looked at again.
    """

    stall_timeout: float = 30.0
    max_attempts: int = 6
    backoff_base: float = 1.0
    backoff_max: float = 30.0
    max_concurrent: int = 2
    progress_interval: float = 0.25
    lock_poll: float = 0.5


class DownloadManager(Transfers):
    """The download queue. Lives on the service loop; every coroutine runs there.

    Args:
        library: where finished models are registered (its ``models_dir`` receives the files).
        hub: resolves references and provides URLs, auth headers and the HTTP client.
        events: receives Download* events and LibraryChanged.
        free_space: bytes free at a path (tests inject a small disk).
        policy: pacing and retries (:class:`DownloadPolicy`).
    """

    def __init__(
        self,
        library: ModelLibrary,
        hub: HubClient,
        events: EventHub,
        *,
        free_space: Callable[[Path], int] = free_space,
        policy: DownloadPolicy | None = None,
    ) -> None:
        policy = policy or DownloadPolicy()
        self.library = library
        self.hub = hub
        self.events = events
        self.free_space = free_space
        self.stall_timeout = policy.stall_timeout
        self.max_attempts = policy.max_attempts
        self.backoff_base = policy.backoff_base
        self.backoff_max = policy.backoff_max
        self.max_concurrent = policy.max_concurrent
        self.progress_interval = policy.progress_interval
        self.lock_poll = policy.lock_poll
        self._jobs: dict[str, Job] = {}
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
        plan = PullPlan.of(info, opt)
        if info.gated or info.private:
            await self.hub.check_access(info.id, opt.first_file.path, revision=info.revision)
        return plan

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

    async def _discard_locked(self, job: Job) -> None:
        """Delete a stopped download's partial files, unless another process is using them."""
        lock = FileLock(job.layout.lock_path)
        try:
            got = lock.try_acquire()
        except OSError:
            return
        if not got:
            log.info("download %s: another process holds its files; not deleting them", job.id)
            return
        shared = self._projector_lock(job)
        try:
            keep = shared is not None and not shared.try_acquire()
        except OSError:
            keep = True
        try:
            await asyncio.to_thread(self._discard, job, keep_projector=keep)
        finally:
            if shared is not None and not keep:
                shared.release(unlink=True)
            lock.release(unlink=True)

    @staticmethod
    def _projector_lock(job: Job) -> FileLock | None:
        path = job.layout.projector_lock_path
        return None if path is None else FileLock(path)

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
    def _job(self, download_id: str) -> Job:
        job = self._jobs.get(download_id)
        if job is None:
            raise DownloadNotFound(f"no download '{download_id}'", param="id")
        return job

    def _submit(self, plan: PullPlan) -> Job:
        job = self._jobs.get(plan.key)
        if job is not None and job.state in ACTIVE and job.task is not None and not job.task.done():
            return job  # the same files are already coming: share that download
        if job is None:
            job = Job(plan, DiskLayout(self.models_dir, plan))
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

    def _launch(self, job: Job) -> None:
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.max_concurrent)
        job.intent = None
        job.error = None
        job.attempt = 0
        if job.future is None or job.future.done():
            job.new_future()
        self._set_state(job, "queued")
        job.task = asyncio.create_task(self._run(job), name=f"download-{job.id}")

    async def _run(self, job: Job) -> None:
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

    def _fail(self, job: Job, e: HearthError) -> None:
        log.info("download %s (%s) failed: %s", job.id, job.plan.name, e.message)
        job.error = e
        self._set_state(job, "failed", force=True)
        if job.future is not None and not job.future.done():
            job.future.set_exception(e)
        self.events.publish(DownloadFailedEvent(download_id=job.id, message=e.message, code=e.code))

    def _set_cancelled(self, job: Job) -> None:
        job.error = DownloadCancelled(f"the download of {job.plan.name} was cancelled")
        self._set_state(job, "cancelled", force=True)
        if job.future is not None and not job.future.done():
            job.future.set_exception(job.error)
        self.events.publish(DownloadCancelledEvent(download_id=job.id))

    def _set_state(self, job: Job, state: str, *, force: bool = True) -> None:
        job.state = state
        self._progress(job, force=force)

    def _progress(self, job: Job, *, force: bool = False) -> None:
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

    def _flush_progress(self, job: Job) -> None:
        job.pending_publish = None
        if job.state in ACTIVE:
            self._progress(job, force=True)

    # -- the download ----------------------------------------------------------------------------
    async def _execute(self, job: Job) -> LocalModel:
        # refuse before creating anything when the disk cannot hold what is left to fetch
        await asyncio.to_thread(self._measure, job)
        await self._check_space(job)
        await asyncio.to_thread(job.layout.prepare)
        lock = FileLock(job.layout.lock_path)
        # try_acquire never blocks (LOCK_NB); on the loop, a cancellation can't strand a held lock
        shared = self._projector_lock(job)
        while not lock.try_acquire():
            if job.state != "waiting":
                log.info("download %s: another process is downloading %s", job.id, job.plan.name)
                self._set_state(job, "waiting")
            await asyncio.sleep(self.lock_poll)
        done = False
        try:
            # another download (a quantization of the same repo) may be fetching the projector
            while shared is not None and not shared.try_acquire():
                if job.state != "waiting":
                    log.info("download %s: waiting for the shared projector", job.id)
                    self._set_state(job, "waiting")
                await asyncio.sleep(self.lock_poll)
        except BaseException:
            lock.release(unlink=False)
            raise
        try:
            if await asyncio.to_thread(job.layout.installed):
                model = await asyncio.to_thread(self._register, job)
                await asyncio.to_thread(job.layout.remove_sidecar)
                done = True
                return model
            await asyncio.to_thread(self._measure, job)
            await self._check_space(job)
            await asyncio.to_thread(job.layout.write_sidecar)
            self._set_state(job, "downloading")
            try:
                for f in job.plan.files:
                    await self._transfer(job, f)
            except ChecksumMismatch:
                if job.bytes_done == 0:  # nothing left to resume: no record of it either
                    await asyncio.to_thread(job.layout.remove_sidecar)
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
            if shared is not None:
                shared.release(unlink=done)
            lock.release(unlink=done)

    async def _check_space(self, job: Job) -> None:
        needed = job.plan.total_bytes - job.bytes_done + DISK_RESERVE
        free = await asyncio.to_thread(self.free_space, job.target.parent)
        if free < needed:
            raise InsufficientStorage(
                f"Not enough disk space for {job.plan.name}: it needs {_mb(needed)} and "
                f"{_mb(free)} are free in {self.models_dir}."
            )

    # -- install ---------------------------------------------------------------------------------
    def _install(self, job: Job) -> LocalModel:
        job.layout.install()
        model = self._register(job)
        job.layout.remove_sidecar()
        return model

    def _measure(self, job: Job) -> None:
        job.have.update(job.layout.measure())

    def _discard(self, job: Job, *, keep_projector: bool = False) -> None:
        job.layout.discard(keep_projector=keep_projector)
        for f in job.plan.files:
            if not (keep_projector and f.path == job.plan.projector):
                job.have[f.path] = 0

    def _register(self, job: Job) -> LocalModel:
        proj = job.plan.projector_file
        model = self.library.add_downloaded(
            job.target,
            source=job.plan.source(),
            projector=None if proj is None else job.layout.final(proj),
        )
        if model.extra.get("projector_refused"):  # the pull's caller tells the user too
            log.warning("download %s: %s", job.id, model.extra["projector_refused"])
        return model

    # -- partial downloads left on disk ----------------------------------------------------------
    def _scan_partials(self) -> None:
        """Adopt sidecars of downloads that a quit or a crash interrupted: listed as paused."""
        if self._scanned:
            return
        self._scanned = True
        for job in found_jobs(self.models_dir, self._jobs):
            if self._settle_found(job):
                self._jobs[job.id] = job

    def _settle_found(self, job: Job) -> bool:
        """Settle what a crash left of a download (unless another process is running it):
        files all in place (killed before the index was written) -> registered, completed; no
        byte to resume -> its record removed; else paused. False: nothing left to list."""
        lock = FileLock(job.layout.lock_path)
        try:
            if not lock.try_acquire():
                return True
        except OSError:
            return True
        settled = False
        try:
            if job.layout.installed():
                try:
                    job.model = self._register(job)
                except HearthError as e:
                    log.warning("download %s: cannot register %s: %s", job.id, job.target, e)
                    return True
                job.layout.remove_sidecar()
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


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"
