"""One download in this process: its state, bytes per file, speed, waiters and watchers.
Tested by tests/core/hub/test_downloads.py and tests/core/library/test_formats.py."""

from __future__ import annotations

import asyncio
import time
from collections import deque

from app.core.types import LocalModel
from app.errors import HearthError

from .layout import DiskLayout
from .plan import DownloadStatus, PullPlan


class Meter:
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


class Job:
    """A download the manager runs; ``layout`` says where its files go."""

    def __init__(self, plan: PullPlan, layout: DiskLayout) -> None:
        self.plan = plan
        self.id = plan.key
        self.layout = layout
        self.target = layout.target
        self.state: str = "queued"
        self.have: dict[str, int] = {f.path: 0 for f in plan.files}
        self.current_file: str | None = None
        self.attempt = 0
        self.error: HearthError | None = None
        self.model: LocalModel | None = None
        self.task: asyncio.Task[None] | None = None
        self.future: asyncio.Future[LocalModel] | None = None
        self.intent: str | None = None  # "pause" | "cancel" while stopping the task
        self.meter = Meter()
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
