"""Downloads from the Hub, verified and resumable: ``plan`` (what one download fetches),
``transfer`` (HTTP Range, retries, verification), ``layout`` (the files on disk; per format in
``app.core.library.formats``), ``manager`` (the queue). Everything public is importable from here.
"""

from __future__ import annotations

from app.core.hub.downloads.layout import SIDECAR_VERSION, DiskLayout
from app.core.hub.downloads.manager import DISK_RESERVE, DownloadManager
from app.core.hub.downloads.plan import ACTIVE, DownloadStatus, PullPlan, State

__all__ = [
    "ACTIVE",
    "DISK_RESERVE",
    "SIDECAR_VERSION",
    "DiskLayout",
    "DownloadManager",
    "DownloadStatus",
    "PullPlan",
    "State",
]
