"""Moving one file's bytes: HTTP Range from the bytes on disk (re-hashed first), retries with
backoff on stalls and 429/5xx, ETag checks, and the sha256 (or git blob sha1) verification.

huggingface_hub gives the URL, the auth headers and its async HTTP client; the bytes move here
because Hearth needs pause, progress events and a hash check that ``hf_hub_download`` lacks.
Tested by tests/core/hub/test_downloads.py and tests/core/library/test_formats.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx2

from app.core.events import DownloadStalled, EventHub
from app.core.hub import HubClient
from app.core.hub.downloads.files import (
    BINARY,
    NOFOLLOW,
    Hasher,
    hash_prefix,
    truncate,
    unlink_quiet,
    write_all,
)
from app.core.library.formats import RepoFile, partial_of
from app.errors import (
    ChecksumMismatch,
    DownloadFailed,
    HubUnavailable,
    RepoNotFound,
    RepoRefused,
)

from .job import Job
from .layout import check_not_symlink

log = logging.getLogger(__name__)


class Retry(Exception):
    """A transient failure: the caller backs off and resumes from the bytes on disk."""

    def __init__(self, reason: str, *, stalled: bool = False, retry_after: float | None = None):
        super().__init__(reason)
        self.reason = reason
        self.stalled = stalled
        self.retry_after = retry_after


class Transfers:
    """The transfer half of ``DownloadManager`` (a mixin: it reports through the manager's state
    and progress methods and reads its retry settings)."""

    hub: HubClient
    events: EventHub
    stall_timeout: float
    max_attempts: int
    backoff_base: float
    backoff_max: float

    if TYPE_CHECKING:  # DownloadManager defines them

        def _set_state(self, job: Job, state: str, *, force: bool = True) -> None: ...

        def _progress(self, job: Job, *, force: bool = False) -> None: ...

    async def _transfer(self, job: Job, f: RepoFile) -> None:
        """Bring one file to a verified ``.partial`` (or leave an already verified final)."""
        final = job.layout.final(f)
        part = partial_of(final)
        size = f.size or 0
        job.current_file = f.path
        if not part.exists() and final.is_file() and not final.is_symlink():
            if final.stat().st_size == size:  # verified and renamed before a crash
                job.have[f.path] = size
                return
        hasher = Hasher(f)
        have = 0
        if part.exists():
            check_not_symlink(part)
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
                    raise Retry("the connection closed before the end of the file")
            except Retry as e:
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

    async def _stream(self, job: Job, f: RepoFile, part: Path, hasher: Hasher) -> None:
        """One HTTP request: append to ``part`` from the bytes it has. Transient trouble: Retry."""
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
                        raise Retry(f"HTTP {st}", retry_after=retry_after_s(r.headers))
                    if st not in (200, 206):
                        raise DownloadFailed(f"the Hub answered HTTP {st} for {f.path}")
                    etag = etag_of(r.headers)
                    restart = have > 0 and st == 200
                    if restart:
                        log.warning(
                            "download %s: the server ignored Range for %s; restarting from zero",
                            job.id,
                            f.path,
                        )
                    if st == 206:
                        start, total = content_range(r.headers.get("content-range"))
                        if total is not None and total != size:
                            raise DownloadFailed(
                                f"{f.path}: the server's file has {total} bytes, the Hub lists {size}"
                            )
                        if start != have:
                            await asyncio.to_thread(truncate, part)
                            job.have[f.path] = 0
                            hasher.reset()
                            raise Retry(f"the server sent bytes from {start}, not {have}")
                    elif st == 200:
                        length = r.headers.get("content-length")
                        if length is not None and length.isdigit() and int(length) != size:
                            raise DownloadFailed(
                                f"{f.path}: the server sends {length} bytes, the Hub lists {size}"
                            )
                    if have and not restart and etag:
                        seen = await asyncio.to_thread(job.layout.sidecar_etag, f.path)
                        if seen and seen != etag:
                            log.warning(
                                "download %s: %s changed on the server; restarting", job.id, f.path
                            )
                            await asyncio.to_thread(truncate, part)
                            job.have[f.path] = 0
                            hasher.reset()
                            raise Retry("the file changed on the server")
                    if etag:
                        await asyncio.to_thread(job.layout.sidecar_etag, f.path, etag)
                    if restart:
                        hasher.reset()
                        job.have[f.path] = 0
                    await self._receive(job, f, part, r, hasher, truncate=job.have[f.path] == 0)
        except httpx2.TimeoutException as e:
            raise Retry(f"no data for {self.stall_timeout:g}s", stalled=True) from e
        except httpx2.TransportError as e:
            raise Retry(f"connection error: {e or type(e).__name__}") from e

    async def _receive(
        self,
        job: Job,
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


def etag_of(headers: Any) -> str | None:
    v = headers.get("x-linked-etag") or headers.get("etag")
    if not v:
        return None
    v = v.strip()
    if v.startswith("W/"):
        v = v[2:]
    return v.strip('"') or None


def content_range(v: str | None) -> tuple[int, int | None]:
    """``bytes START-END/TOTAL`` -> (START, TOTAL or None); anything else -> (-1, None)."""
    if not v or not v.startswith("bytes "):
        return -1, None
    rng, _, total = v[6:].partition("/")
    start, _, _ = rng.partition("-")
    try:
        return int(start), (int(total) if total.strip().isdigit() else None)
    except ValueError:
        return -1, None


def retry_after_s(headers: Any) -> float | None:
    v = headers.get("retry-after")
    if v is None:
        return None
    try:
        return max(0.0, min(float(v), 120.0))
    except ValueError:
        return None
