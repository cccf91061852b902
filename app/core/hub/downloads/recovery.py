"""Downloads a quit or a crash interrupted, found again from their sidecar records on disk.
Tested by tests/core/hub/test_downloads.py and tests/core/library/test_formats.py."""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Container, Iterator
from pathlib import Path

from app.errors import HearthError

from .job import Job
from .layout import DiskLayout
from .plan import PullPlan

log = logging.getLogger(__name__)


def found_jobs(models_dir: Path, known: Container[str]) -> Iterator[Job]:
    """Jobs for the sidecars under ``models_dir`` (skipping ``known`` ids), measured and paused.

    A record is never trusted: a malformed one, one in the wrong place or behind a symlink is
    skipped (and logged).
    """
    if not models_dir.is_dir():
        return
    sides = list(models_dir.glob("*/.*.partial.json")) + list(
        models_dir.glob("*/*/.*.partial.json")
    )
    for side in sides:
        if side.is_symlink():
            continue
        try:
            data = json.loads(side.read_text())
            plan = PullPlan.from_dict(data.get("plan") if isinstance(data, dict) else None)
        except (OSError, ValueError, HearthError) as e:
            log.warning("ignoring a malformed download record %s: %s", side, e)
            continue
        if plan.key in known:
            continue
        job = Job(plan, DiskLayout(models_dir, plan))
        if job.layout.sidecar != side:
            log.warning("ignoring a download record in the wrong place: %s", side)
            continue
        try:
            job.have.update(job.layout.measure())
        except OSError:
            continue
        job.state = "paused"
        with contextlib.suppress(OSError):
            job.started_at = side.stat().st_mtime
        yield job
