"""Start at login: the OS's own autostart of the desktop app, one file or value per platform.

- Linux (and other XDG desktops): ``$XDG_CONFIG_HOME/autostart/hearth.desktop``
  (``~/.config`` when unset), a desktop entry the session starts at login.
- macOS: ``~/Library/LaunchAgents/<LAUNCH_AGENT_ID>.plist``, a LaunchAgent with RunAtLoad.
- Windows: the value ``Hearth`` under ``HKCU\\Software\\Microsoft\\Windows\\CurrentVersion\\Run``
  (winreg is imported only there).

The started command is the app with ``--background``: hidden in the tray where there is one,
the server started when the user chose that. The content of each entry is computed by a pure
function (tested on every platform); only the writing touches the OS.
"""

from __future__ import annotations

import contextlib
import logging
import os
import plistlib
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.core.util.fsutil import atomic_write_bytes
from app.errors import ConfigError

log = logging.getLogger(__name__)

APP_ID = "hearth"  # the desktop entry's id (the file name without .desktop)
LAUNCH_AGENT_ID = "io.github.hearth.Hearth"
RUN_KEY = r"Software\Microsoft\Windows\CurrentVersion\Run"
RUN_VALUE_NAME = "Hearth"
BACKGROUND_FLAG = "--background"
ICON = Path(__file__).resolve().parents[2] / "assets" / "hearth.png"  # app/assets


def launch_command(
    *,
    frozen: bool | None = None,
    executable: str | None = None,
    env: Mapping[str, str] | None = None,
) -> tuple[str, ...]:
    """What autostart runs: the frozen bundle's executable (PyInstaller sets ``sys.frozen``;
    inside an AppImage, the AppImage file itself, since its mount point changes every run),
    else this interpreter with ``-m app``; both with ``--background``."""
    frozen = bool(getattr(sys, "frozen", False)) if frozen is None else frozen
    env = os.environ if env is None else env
    exe = executable or sys.executable
    if frozen:
        return (env.get("APPIMAGE") or exe, BACKGROUND_FLAG)
    return (exe, "-m", "app", BACKGROUND_FLAG)


# -- Linux (XDG) ---------------------------------------------------------------------------------
def xdg_entry_path(env: Mapping[str, str] | None = None, home: Path | None = None) -> Path:
    """``$XDG_CONFIG_HOME/autostart/hearth.desktop``; a relative XDG_CONFIG_HOME is ignored, as
    the spec says."""
    env = os.environ if env is None else env
    base = env.get("XDG_CONFIG_HOME", "")
    root = Path(base) if base and Path(base).is_absolute() else (home or _home(env)) / ".config"
    return root / "autostart" / f"{APP_ID}.desktop"


def _exec_arg(arg: str) -> str:
    """One Exec argument, quoted per the desktop entry spec where it needs it."""
    if arg and not any(c in arg for c in " \t\n\"'\\><~|&;$*?#()`="):
        return arg.replace("%", "%%")
    escaped = "".join("\\" + c if c in '"`$\\' else c for c in arg)
    # the string escape applies on top of the quoting one: a backslash is written twice again
    return ('"' + escaped + '"').replace("\\", "\\\\").replace("%", "%%")


def desktop_entry(command: Sequence[str], icon: Path = ICON) -> str:
    """A desktop entry that starts ``command`` at login."""
    lines = [
        "[Desktop Entry]",
        "Type=Application",
        "Version=1.0",
        "Name=Hearth",
        "Comment=Run open LLMs locally and serve them to your tools",
        "Exec=" + " ".join(_exec_arg(a) for a in command),
        f"Icon={icon}",
        "Terminal=false",
        "Categories=Development;Utility;",
        "X-GNOME-Autostart-enabled=true",
    ]
    return "\n".join(lines) + "\n"


# -- macOS ---------------------------------------------------------------------------------------
def launch_agent_path(home: Path) -> Path:
    return home / "Library" / "LaunchAgents" / f"{LAUNCH_AGENT_ID}.plist"


def launch_agent_plist(command: Sequence[str]) -> bytes:
    """A LaunchAgent that runs ``command`` once at login (no KeepAlive: Quit means quit)."""
    return plistlib.dumps(
        {
            "Label": LAUNCH_AGENT_ID,
            "ProgramArguments": list(command),
            "RunAtLoad": True,
            "ProcessType": "Interactive",
        }
    )


# -- Windows ---------------------------------------------------------------------------------------
def windows_run_value(command: Sequence[str]) -> str:
    """The Run key's value: one command line, quoted as Windows parses it."""
    return subprocess.list2cmdline(list(command))


def _home(env: Mapping[str, str]) -> Path:
    h = env.get("HOME") or env.get("USERPROFILE")
    return Path(h) if h else Path.home()


@dataclass
class Autostart:
    """Enable, disable and query start at login on ``platform`` (``sys.platform`` values).

    ``env`` and ``home`` default to this process's; tests pass a temporary HOME or
    XDG_CONFIG_HOME. ``command`` defaults to ``launch_command()``.
    """

    platform: str = sys.platform
    env: Mapping[str, str] | None = None
    home: Path | None = None
    command: tuple[str, ...] = field(default_factory=launch_command)

    @property
    def kind(self) -> str:
        if self.platform == "win32":
            return "windows"
        if self.platform == "darwin":
            return "macos"
        return "xdg"

    @property
    def path(self) -> Path | None:
        """The file autostart lives in (None on Windows: a registry value)."""
        env = os.environ if self.env is None else self.env
        home = self.home or _home(env)
        if self.kind == "macos":
            return launch_agent_path(home)
        if self.kind == "xdg":
            return xdg_entry_path(env, home)
        return None

    @property
    def location(self) -> str:
        """Where it is, in words (for tooltips)."""
        p = self.path
        return str(p) if p is not None else "HKCU\\" + RUN_KEY + "\\" + RUN_VALUE_NAME

    def content(self) -> bytes:
        """What ``enable`` writes: the file's bytes, or the Run value encoded as UTF-8."""
        if self.kind == "macos":
            return launch_agent_plist(self.command)
        if self.kind == "xdg":
            return desktop_entry(self.command).encode()
        return windows_run_value(self.command).encode()

    def enabled(self) -> bool:
        if self.kind == "windows":
            return self._read_run_value() is not None
        p = self.path
        return p is not None and p.is_file()

    def set_enabled(self, on: bool) -> None:
        """Write or remove the entry.

        Raises:
            ConfigError: the file or registry value cannot be written.
        """
        try:
            if self.kind == "windows":
                self._write_run_value(windows_run_value(self.command) if on else None)
                return
            p = self.path
            if p is None:  # pragma: no cover - every non-Windows kind has a path
                return
            if on:
                p.parent.mkdir(parents=True, exist_ok=True)
                atomic_write_bytes(p, self.content(), mode=0o644)
                log.info("start at login: wrote %s", p)
            else:
                with contextlib.suppress(FileNotFoundError):
                    p.unlink()
                    log.info("start at login: removed %s", p)
        except OSError as e:
            raise ConfigError(f"cannot change start at login ({self.location}): {e}") from e

    # -- Windows registry (only ever called on Windows) ----------------------------------------
    def _winreg(self) -> Any:
        import winreg  # type: ignore[import-not-found,unused-ignore]

        return winreg

    def _read_run_value(self) -> str | None:
        if sys.platform != "win32":
            return None  # a Windows Autostart queried elsewhere (tests): nothing to read
        winreg = self._winreg()
        try:
            with winreg.OpenKey(winreg.HKEY_CURRENT_USER, RUN_KEY) as key:
                value, _ = winreg.QueryValueEx(key, RUN_VALUE_NAME)
        except OSError:
            return None
        return str(value)

    def _write_run_value(self, value: str | None) -> None:
        if sys.platform != "win32":
            raise ConfigError("the Windows Run key can only be changed on Windows")
        winreg = self._winreg()
        with winreg.CreateKey(winreg.HKEY_CURRENT_USER, RUN_KEY) as key:
            if value is None:
                with contextlib.suppress(FileNotFoundError):
                    winreg.DeleteValue(key, RUN_VALUE_NAME)
            else:
                winreg.SetValueEx(key, RUN_VALUE_NAME, 0, winreg.REG_SZ, value)
