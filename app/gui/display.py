"""Can Qt open a window here? Checked before the QApplication exists, because Qt aborts the
whole process (exit 134) when its platform plugin cannot start, with a message that blames
libxcb-cursor0 even when there is simply no display.
Tested by tests/gui/test_display.py."""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

# What `hearth` exits with when it cannot open its window here (documented in docs/desktop.md)
EXIT_NO_DISPLAY = 2

# Debian/Ubuntu packages Qt 6's X11 (xcb) platform plugin loads; the first three are the ones a
# desktop install most often lacks
XCB_PACKAGES = (
    "libxcb-cursor0 libxcb-icccm4 libxcb-keysyms1 libxcb-image0 libxcb-render-util0 "
    "libxcb-randr0 libxcb-shape0 libxcb-shm0 libxcb-sync1 libxcb-xfixes0 libxcb-xkb1 "
    "libxcb-util1 libxkbcommon-x11-0 libx11-xcb1 libegl1 libgl1 libfontconfig1 libglib2.0-0 "
    "libdbus-1-3"
)
_NOT_FOUND = re.compile(r"^\s*(\S+) => not found", re.M)
_DLOPEN_MISSING = re.compile(r"(\S+\.so[.\d]*): cannot open shared object file")


def display_problem(env: Mapping[str, str] | None = None) -> str | None:
    """Why the window cannot open here, in words for the terminal, or None when it can (as
    far as can be told without starting Qt). Linux only: elsewhere a display always exists."""
    env = os.environ if env is None else env
    if not sys.platform.startswith("linux"):
        return None
    forced = env.get("QT_QPA_PLATFORM", "")
    if forced and not forced.startswith("xcb"):
        return None  # offscreen, wayland, vnc...: the user chose; Qt reports its own errors
    has_x11 = bool(env.get("DISPLAY"))
    if not has_x11 and (forced or not env.get("WAYLAND_DISPLAY")):
        return (
            "hearth: no display found (DISPLAY and WAYLAND_DISPLAY are not set), so the "
            "window cannot open.\n"
            "  On a server or over SSH, run `hearth serve` for the headless server "
            "(`hearth --help` lists the other commands).\n"
        )
    if env.get("WAYLAND_DISPLAY") and not forced:
        return None  # Qt uses its Wayland plugin first
    plugin = xcb_plugin()
    missing = missing_libraries(plugin) if plugin is not None else []
    if not missing:
        return None
    return (
        "hearth: the window cannot open: Qt's X11 plugin needs libraries that are not "
        f"installed: {', '.join(missing)}.\n"
        f"  On Debian or Ubuntu: sudo apt install {XCB_PACKAGES}\n"
        "  (Fedora: sudo dnf install xcb-util-cursor xcb-util-wm xcb-util-keysyms)\n"
        "  Or run `hearth serve` for the headless server.\n"
    )


def xcb_plugin() -> Path | None:
    """Qt's X11 platform plugin (libqxcb.so) as the app would load it, or None."""
    from PySide6.QtCore import QLibraryInfo

    dirs = [QLibraryInfo.path(QLibraryInfo.LibraryPath.PluginsPath)]
    dirs += [d for d in os.environ.get("QT_PLUGIN_PATH", "").split(os.pathsep) if d]
    for d in dirs:
        p = Path(d) / "platforms" / "libqxcb.so"
        if p.is_file():
            return p
    return None


def missing_libraries(plugin: Path) -> list[str]:
    """The shared libraries ``plugin`` needs that the system loader cannot find ([] when it
    loads). The loader names only the first it misses; ldd, where present, lists them all."""
    try:
        ctypes.CDLL(str(plugin), mode=os.RTLD_LAZY | os.RTLD_LOCAL)
        return []
    except OSError as e:
        error = str(e)
    ldd = shutil.which("ldd")
    if ldd is not None:
        try:
            out = subprocess.run([ldd, str(plugin)], capture_output=True, text=True, timeout=30)
            found = list(dict.fromkeys(_NOT_FOUND.findall(out.stdout)))
            if found:
                return found
        except (OSError, subprocess.SubprocessError):
            pass
    m = _DLOPEN_MISSING.search(error)
    return [m.group(1) if m else error]
