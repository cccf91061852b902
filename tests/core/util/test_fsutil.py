"""fsutil on real files and real processes: the lock excludes, leaves no file, and temp files
of killed writers are cleaned while those of live writers are kept."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from app.core.engine.presets import PresetStore
from app.core.library.index import ModelLibrary
from app.core.util import fsutil
from app.core.util.fsutil import atomic_write_json, file_lock, read_json, temp_path
from app.settings import SettingsStore

REPO = Path(__file__).resolve().parents[3]

# each process takes the lock ROUNDS times; inside it, an O_EXCL marker proves nobody else is
# inside, and a read-modify-write of a counter would lose updates if two were
_LOCKER = """
import os, sys, time
from pathlib import Path
from app.core.util.fsutil import file_lock
target, rounds, start = Path(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
marker, counter = target.with_name("inside"), target.with_name("counter")
while time.time() < start:
    time.sleep(0.001)
for _ in range(rounds):
    with file_lock(target):
        try:
            fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            print("two holders at once", flush=True)
            sys.exit(3)
        os.close(fd)
        n = int(counter.read_text()) if counter.exists() else 0
        counter.write_text(str(n + 1))
        os.unlink(marker)
"""


def test_file_lock_excludes_processes_and_leaves_no_lock_file(tmp_path: Path) -> None:
    target = tmp_path / "shared.json"
    procs, rounds = 4, 300
    start = time.time() + 1.5  # all processes contend from the same moment
    ps = [
        subprocess.Popen(
            [sys.executable, "-c", _LOCKER, str(target), str(rounds), str(start)],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(procs)
    ]
    for p in ps:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, out + err
    assert int((tmp_path / "counter").read_text()) == procs * rounds
    assert sorted(f.name for f in tmp_path.iterdir()) == ["counter"], "no .lock left behind"


def test_file_lock_is_released_on_error_and_removed(tmp_path: Path) -> None:
    target = tmp_path / "x.json"
    try:
        with file_lock(target):
            assert (tmp_path / "x.json.lock").exists()
            raise RuntimeError("boom")
    except RuntimeError:
        pass
    assert not (tmp_path / "x.json.lock").exists()
    with file_lock(target):  # free again at once
        pass


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid  # reaped: no process has this pid until the kernel reuses it


def test_temp_names_carry_the_writer_pid(tmp_path: Path) -> None:
    t = temp_path(tmp_path / "settings.json")
    assert t.parent == tmp_path and t.name.startswith(f".settings.json.{os.getpid()}.")
    assert t.name.endswith(".tmp")


def test_stale_temp_files_of_dead_writers_are_removed_live_ones_kept(tmp_path: Path) -> None:
    cfg = tmp_path / "config"
    cfg.mkdir()
    target = cfg / "settings.json"
    dead, live = _dead_pid(), os.getpid()
    stale = cfg / f".settings.json.{dead}.0badc0de.tmp"
    mine = cfg / f".settings.json.{live}.5eed5eed.tmp"
    other = cfg / f".presets.json.{dead}.0badc0de.tmp"
    for f in (stale, mine, other):
        f.write_text('{"half": ')
    SettingsStore(target)  # the store cleans its own leftovers when it starts
    assert not stale.exists() and mine.exists() and other.exists()
    PresetStore(cfg / "presets.json")
    assert not other.exists() and mine.exists()


def test_a_write_cleans_leftovers_of_its_file_first(tmp_path: Path) -> None:
    target = tmp_path / "server.json"
    dead = _dead_pid()
    stale = [tmp_path / f".server.json.{dead}.{i:08x}.tmp" for i in range(3)]
    for f in stale:
        f.write_text("x")
    mine = tmp_path / f".server.json.{os.getpid()}.00000000.tmp"
    mine.write_text("x")
    atomic_write_json(target, {"a": 1})
    assert read_json(target, None) == {"a": 1}
    assert not any(f.exists() for f in stale) and mine.exists()


def test_old_style_temp_names_are_removed_only_when_old(tmp_path: Path) -> None:
    target = tmp_path / "library.json"
    fresh, old = tmp_path / ".library.json.k2x9_q.tmp", tmp_path / ".library.json.a8b7c6.tmp"
    fresh.write_text("x")
    old.write_text("x")
    t = time.time() - fsutil.STALE_TEMP_AGE_S - 60
    os.utime(old, (t, t))
    atomic_write_json(target, {})
    assert fresh.exists() and not old.exists()


def test_library_uses_the_same_cleanup_for_index_and_copies(tmp_path: Path) -> None:
    data, models = tmp_path / "data", tmp_path / "models"
    data.mkdir()
    models.mkdir()
    dead = _dead_pid()
    stale_index = data / f".library.json.{dead}.0badc0de.tmp"
    stale_copy = models / f".model.gguf.{dead}.0badc0de.partial"
    live_copy = models / f".other.gguf.{os.getpid()}.0badc0de.partial"
    stale_folder = models / f".qwen-mlx.{dead}.0badc0de.partial"
    for f in (stale_index, stale_copy, live_copy):
        f.write_text("x")
    stale_folder.mkdir()
    (stale_folder / "config.json").write_text("{}")
    ModelLibrary(data / "library.json", models)
    assert not stale_index.exists() and not stale_copy.exists() and not stale_folder.exists()
    assert live_copy.exists(), "a copy in progress in a live process is never removed"
