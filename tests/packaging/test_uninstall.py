"""install.sh and uninstall.sh on an unpacked tarball's layout, into an empty HOME, without a
built bundle: the start-at-login entry the app writes goes with the app when it starts this
install (and only then), and the goodbye says where models, settings, cache and logs stay."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from app.core.desktop.autostart import desktop_entry, launch_command

REPO = Path(__file__).resolve().parents[2]
LINUX = REPO / "packaging" / "linux"

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the Linux scripts")


def unpacked(tmp_path: Path) -> Path:
    """The folder build.sh tars: hearth/ (here a stand-in executable), the scripts, the icon
    and the desktop-entry template."""
    top = tmp_path / "hearth-0-linux-x86_64"
    (top / "hearth").mkdir(parents=True)
    exe = top / "hearth" / "hearth"
    exe.write_text("#!/bin/sh\necho hearth 0\n")
    exe.chmod(0o755)
    for name in ("install.sh", "uninstall.sh"):
        shutil.copy(LINUX / name, top / name)
    shutil.copy(REPO / "assets" / "hearth.png", top / "hearth.png")
    shutil.copy(LINUX / "hearth.desktop.in", top / "hearth.desktop.in")
    return top


def sh(script: Path, env: dict[str, str]) -> str:
    got = subprocess.run(["/bin/sh", str(script)], env=env, capture_output=True, text=True)
    assert got.returncode == 0, got.stdout + got.stderr
    return got.stdout


@pytest.mark.parametrize("data_dir", ["data", "my data"])
def test_uninstall_removes_the_autostart_entry_that_starts_this_install(
    tmp_path: Path, data_dir: str
) -> None:
    home, data = tmp_path / "home", tmp_path / data_dir
    home.mkdir()
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "XDG_DATA_HOME": str(data)}
    sh(unpacked(tmp_path) / "install.sh", env)
    app = data / "hearth" / "hearth"
    # what the app writes when "start at login" is on, run from this install (frozen)
    autostart = home / ".config" / "autostart" / "hearth.desktop"
    autostart.parent.mkdir(parents=True)
    command = launch_command(frozen=True, executable=str(app), env={})
    autostart.write_text(desktop_entry(command, icon=data / "hearth" / "hearth.png"))

    said = sh(data / "hearth" / "uninstall.sh", env)
    assert not autostart.exists()
    assert not app.parent.exists()
    assert "logs" in said and str(home / ".local" / "state" / "Hearth") in said
    for folder in (data / "Hearth", home / ".config" / "Hearth", home / ".cache" / "Hearth"):
        assert str(folder) in said


def test_uninstall_keeps_an_autostart_entry_of_another_copy(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home)}
    sh(unpacked(tmp_path) / "install.sh", env)
    autostart = home / ".config" / "autostart" / "hearth.desktop"
    autostart.parent.mkdir(parents=True)
    other = desktop_entry(launch_command(frozen=True, executable="/opt/hearth/hearth", env={}))
    autostart.write_text(other)

    sh(home / ".local" / "share" / "hearth" / "uninstall.sh", env)
    assert autostart.read_text() == other
    assert not (home / ".local" / "share" / "hearth").exists()
