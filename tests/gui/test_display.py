"""`hearth` with no arguments where Qt cannot open a window: a plain message and exit 2 instead
of Qt's abort (exit 134) blaming libxcb-cursor0. Run as a real child process, as a user would."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from app.gui.display import EXIT_NO_DISPLAY, XCB_PACKAGES, missing_libraries, xcb_plugin

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="X11/Wayland")


def run_hearth(tmp_path: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    """``python -m app`` (the window) with the user's environment less any display."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM")
    }
    env.update(HEARTH_HOME=str(tmp_path / "home"), **extra)
    return subprocess.run(
        [sys.executable, "-m", "app"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_no_display_says_so_and_points_to_serve(tmp_path: Path) -> None:
    got = run_hearth(tmp_path)
    assert got.returncode == EXIT_NO_DISPLAY == 2, got.stderr
    assert "no display found" in got.stderr
    assert "hearth serve" in got.stderr
    assert "xcb-cursor" not in got.stderr  # Qt's misleading message never comes


def test_xcb_forced_without_a_display_says_so(tmp_path: Path) -> None:
    got = run_hearth(tmp_path, QT_QPA_PLATFORM="xcb")
    assert got.returncode == 2, got.stderr
    assert "no display found" in got.stderr


def test_missing_x11_libraries_are_named_with_their_packages(tmp_path: Path) -> None:
    """Where this machine really lacks a library Qt's X11 plugin needs, the message names it
    and the packages to install (a machine with all of them opens the window instead)."""
    plugin = xcb_plugin()
    if plugin is None or not missing_libraries(plugin):
        pytest.skip("Qt's X11 plugin has all its libraries here")
    got = run_hearth(tmp_path, DISPLAY=":99")  # never reached: the check comes first
    assert got.returncode == 2, got.stderr
    for lib in missing_libraries(plugin):
        assert lib in got.stderr
    assert XCB_PACKAGES in got.stderr
    assert "libxcb-cursor0 libxcb-icccm4 libxcb-keysyms1" in got.stderr


def test_a_library_that_needs_a_missing_one_is_reported(tmp_path: Path) -> None:
    """A real shared library linked against one that is then removed: the loader's miss."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build the libraries")
    dep, plugin = tmp_path / "libgone-dep.so.1", tmp_path / "libplugin.so"
    (tmp_path / "dep.c").write_text("int gone_dep(void) { return 1; }\n")
    (tmp_path / "plugin.c").write_text(
        "int gone_dep(void);\nint use(void) { return gone_dep(); }\n"
    )

    def build_dep() -> None:
        subprocess.run(
            [cc, "-shared", "-fPIC", "-Wl,-soname,libgone-dep.so.1", "-o", str(dep), "dep.c"],
            cwd=tmp_path,
            check=True,
        )

    build_dep()
    subprocess.run(
        [cc, "-shared", "-fPIC", "-Wl,-rpath,$ORIGIN", "-o", str(plugin), "plugin.c", str(dep)],
        cwd=tmp_path,
        check=True,
    )
    dep.unlink()
    assert missing_libraries(plugin) == ["libgone-dep.so.1"]
    build_dep()
    assert missing_libraries(plugin) == []
