"""llama.cpp's one-time check of a model file (app/runtimes/llama/probe.py), shared by the
tests' homes.

A probe child loads a new file and answers once before Hearth's process loads it, ~1.4 s for
SmolLM2, and its verdict is kept in the home's ``cache/runtime-probe.json``. The verdict is per
file, CPU, llama.cpp build and load options, not per home: here each fresh home starts with what
the homes before it found (``seed``) and adds what it found (``keep``), as one machine's homes
would if they shared that file. Tests of the probe itself keep their own files.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from app.core.util.fsutil import atomic_write_json, file_lock, read_json

_shared: list[Path] = []


def use(path: Path) -> None:
    """Keep the shared verdicts at ``path`` (the root conftest: under pytest's base temp)."""
    _shared[:] = [path]


def shared() -> Path:
    """The shared verdict file; a fresh temporary one outside pytest (a benchmark script)."""
    if not _shared:
        use(Path(tempfile.mkdtemp(prefix="hearth-probe-")) / "runtime-probe.json")
    return _shared[0]


def seed(home_file: Path) -> None:
    """Start ``home_file`` (a fresh home's verdicts) with the shared ones (under pytest only:
    a benchmark's homes probe as a user's would)."""
    if not _shared:
        return
    src = _shared[0]
    if home_file.exists() or not src.exists():
        return
    home_file.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(src):
        shutil.copyfile(src, home_file)


def keep(home_file: Path) -> None:
    """Add the verdicts ``home_file`` holds to the shared ones (under pytest only)."""
    if not _shared:
        return
    try:
        found = read_json(home_file, {})
    except (OSError, ValueError):
        return
    if not isinstance(found, dict) or not found:
        return
    dest = _shared[0]
    dest.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(dest):
        known = read_json(dest, {}) if dest.exists() else {}
        known.update(found)
        atomic_write_json(dest, known)
