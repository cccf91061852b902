"""A real small filesystem for disk-full tests: a tmpfs of a few MB that really answers ENOSPC.

Two ways to get one, so the tests run on CI runners and dev machines as well as root shells:

- ``mount``: as root with mounts allowed, the tmpfs is mounted here; every process sees it.
- ``userns``: without root, ``unshare --user --map-root-user --mount`` gives a child its own user
  and mount namespace in which it may mount a tmpfs. A small holder process keeps that namespace
  alive (it lives as long as its stdin stays open); Hearth processes enter it with ``nsenter``
  (``prefix``) and the test reads and writes the disk through ``/proc/HOLDER/root`` (``view``),
  which the namespace's owner may do.

``open_small_disk`` returns None with the exact reason where neither works.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
from pathlib import Path

MODES = ("mount", "userns")


class SmallDisk:
    """A tmpfs of ``size`` bytes mounted at ``path`` (as seen by the processes that use it)."""

    def __init__(self, path: Path, size: int, mode: str) -> None:
        self.path = path
        self.size = size
        self.mode = mode
        self._holder: subprocess.Popen[str] | None = None

    @property
    def prefix(self) -> list[str]:
        """What to put before a command so the process sees the small disk at ``path``."""
        if self._holder is None:
            return []
        return [
            "nsenter",
            f"--target={self._holder.pid}",
            "--user",
            "--mount",
            "--preserve-credentials",
            f"--wd={os.getcwd()}",
            "--",
        ]

    def view(self, p: Path | None = None) -> Path:
        """``p`` (a path under ``path``; default ``path``) as this test process reaches it."""
        p = self.path if p is None else p
        if self._holder is None:
            return p
        return Path(f"/proc/{self._holder.pid}/root") / p.relative_to("/")

    def fill(self) -> Path:
        """Write a file until the disk is full (the real ENOSPC); returns its path here."""
        filler = self.view() / "filler.bin"
        block = b"\0" * 65536
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            while True:
                try:
                    os.write(fd, block)
                except OSError as e:
                    if e.errno == errno.ENOSPC:
                        break
                    raise
        finally:
            os.close(fd)
        return filler

    def close(self) -> None:
        if self._holder is not None:
            if self._holder.stdin is not None:
                self._holder.stdin.close()  # the holder (cat) exits; the namespace goes with it
            try:
                self._holder.wait(30)
            except subprocess.TimeoutExpired:
                self._holder.kill()
                self._holder.wait(30)
            self._holder = None
        elif self.mode == "mount":
            subprocess.run(["umount", "-l", str(self.path)], capture_output=True)


def open_small_disk(path: Path, size: int, mode: str) -> tuple[SmallDisk | None, str]:
    """Mount a ``size``-byte tmpfs at ``path`` (created if missing) the ``mode`` way.

    Returns (disk, "") or (None, why it cannot be done here).
    """
    path.mkdir(parents=True, exist_ok=True)
    opts = f"size={size}"
    if mode == "mount":
        if shutil.which("mount") is None:
            return None, "mount (util-linux) is not installed"
        r = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(path)],
            capture_output=True,
            text=True,
        )
        if r.returncode != 0:
            why = (r.stderr.strip().splitlines() or [f"exit {r.returncode}"])[0]
            return None, f"mount -t tmpfs is not allowed here: {why}"
        return SmallDisk(path, size, mode), ""
    if mode != "userns":
        raise ValueError(mode)
    for tool in ("unshare", "nsenter"):
        if shutil.which(tool) is None:
            return None, f"{tool} (util-linux) is not installed"
    holder = subprocess.Popen(
        [
            "unshare",
            "--user",
            "--map-root-user",
            "--mount",
            "sh",
            "-c",
            'mount -t tmpfs -o "$1" tmpfs "$2" && echo mounted && exec cat',
            "sh",
            opts,
            str(path),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None
    line = holder.stdout.readline().strip()
    if line != "mounted":
        holder.kill()
        _, err = holder.communicate(timeout=30)
        why = (err.strip().splitlines() or [f"exit {holder.returncode}"])[0]
        return None, (
            "no user+mount namespace with a tmpfs here "
            f"(unshare --user --map-root-user --mount): {why}"
        )
    disk = SmallDisk(path, size, mode)
    disk._holder = holder
    return disk, ""
