"""Start at login: each platform's entry is written where that platform looks, with
the content it expects. The Linux entry is written and removed for real (HOME and
XDG_CONFIG_HOME under tmp_path); the macOS plist is written under a temporary home; the Windows
Run value is checked as a string (winreg is never imported off Windows)."""

from __future__ import annotations

import configparser
import plistlib
import sys
from pathlib import Path

import pytest

from app.cli import build_parser
from app.cli.serve import cmd_gui
from app.core.desktop.autostart import (
    LAUNCH_AGENT_ID,
    Autostart,
    desktop_entry,
    launch_command,
    windows_run_value,
    xdg_entry_path,
)
from app.errors import ConfigError


def parse_desktop(text: str) -> dict[str, str]:
    cp = configparser.ConfigParser(interpolation=None)
    cp.optionxform = str  # type: ignore[assignment,method-assign]  # keys are case-sensitive
    cp.read_string(text)
    return dict(cp["Desktop Entry"])


def exec_args(exec_value: str) -> list[str]:
    """An Exec value back to its arguments, as the desktop entry spec reads it: the string
    escape (``\\\\`` is one backslash), then quoting (inside double quotes a backslash escapes
    one of ``"`$\\``), then field codes (``%%`` is a percent sign)."""
    text = exec_value.replace("\\\\", "\\")
    args: list[str] = []
    cur: list[str] = []
    quoted = started = False
    i = 0
    while i < len(text):
        c = text[i]
        if quoted and c == "\\" and i + 1 < len(text) and text[i + 1] in '"`$\\':
            cur.append(text[i + 1])
            i += 1
        elif c == '"':
            quoted, started = not quoted, True
        elif c == " " and not quoted:
            if cur or started:
                args.append("".join(cur))
            cur, started = [], False
        else:
            cur.append(c)
        i += 1
    if cur or started:
        args.append("".join(cur))
    return [a.replace("%%", "%") for a in args]


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    h = tmp_path / "home"
    h.mkdir()
    monkeypatch.setenv("HOME", str(h))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    return h


def test_the_command_is_this_interpreter_with_m_app_or_the_frozen_bundle() -> None:
    assert launch_command(frozen=False, executable="/opt/py/bin/python3") == (
        "/opt/py/bin/python3",
        "-m",
        "app",
        "--background",
    )
    assert launch_command(frozen=True, executable="/opt/Hearth/hearth") == (
        "/opt/Hearth/hearth",
        "--background",
    )
    # an AppImage runs from a new mount point each time: autostart names the AppImage file
    appimage = {"APPIMAGE": "/home/me/Apps/Hearth-x86_64.AppImage"}
    assert launch_command(frozen=True, executable="/tmp/.mount_X/hearth", env=appimage) == (
        "/home/me/Apps/Hearth-x86_64.AppImage",
        "--background",
    )
    assert launch_command(frozen=False, executable="/py", env=appimage)[0] == "/py"
    # here (not frozen): the running interpreter
    assert launch_command() == (sys.executable, "-m", "app", "--background")


def test_background_is_a_flag_of_the_app_command() -> None:
    args = build_parser().parse_args(["--background"])
    assert args.background is True and getattr(args, "func", cmd_gui) is cmd_gui
    assert build_parser().parse_args([]).background is False


def test_linux_entry_goes_to_the_xdg_autostart_folder_and_back_out(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "xdg-config"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(config))
    cmd = ("/opt/py/bin/python3", "-m", "app", "--background")
    a = Autostart(platform="linux", command=cmd)
    assert a.path == config / "autostart" / "hearth.desktop"
    assert not a.enabled()

    a.set_enabled(True)
    assert a.enabled() and a.path.is_file()
    entry = parse_desktop(a.path.read_text())
    assert entry["Type"] == "Application"
    assert entry["Name"] == "Hearth"
    assert entry["X-GNOME-Autostart-enabled"] == "true"
    assert exec_args(entry["Exec"]) == list(cmd)
    assert Path(entry["Icon"]).is_file()  # the app's own icon file

    a.set_enabled(False)
    assert not a.enabled() and not a.path.exists()
    a.set_enabled(False)  # removing what is not there is fine
    assert not (home / ".config").exists()  # XDG_CONFIG_HOME was used, not ~/.config


def test_linux_entry_defaults_to_dot_config_and_ignores_a_relative_xdg_config_home(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = Autostart(platform="linux")
    a.set_enabled(True)
    assert (home / ".config" / "autostart" / "hearth.desktop").is_file()
    monkeypatch.setenv("XDG_CONFIG_HOME", "relative/config")
    assert xdg_entry_path() == home / ".config" / "autostart" / "hearth.desktop"
    a.set_enabled(False)
    assert not (home / ".config" / "autostart" / "hearth.desktop").exists()


def test_exec_quotes_arguments_with_spaces_and_special_characters() -> None:
    cmd = ("/home/me/My Apps/py$thon", 'we"ird\\path', "100%", "--background")
    entry = parse_desktop(desktop_entry(cmd))
    assert exec_args(entry["Exec"]) == list(cmd)
    assert entry["Exec"].startswith('"/home/me/My Apps/py\\\\$thon" ')  # quoted, $ escaped


def test_macos_launch_agent_plist_path_and_content(home: Path) -> None:
    cmd = ("/Applications/Hearth.app/Contents/MacOS/Hearth", "--background")
    a = Autostart(platform="darwin", command=cmd)
    assert a.path == home / "Library" / "LaunchAgents" / f"{LAUNCH_AGENT_ID}.plist"
    a.set_enabled(True)
    assert a.enabled()
    plist = plistlib.loads(a.path.read_bytes())
    assert plist["Label"] == LAUNCH_AGENT_ID
    assert plist["ProgramArguments"] == list(cmd)
    assert plist["RunAtLoad"] is True
    assert "KeepAlive" not in plist  # Quit must stay quit
    a.set_enabled(False)
    assert not a.enabled() and not a.path.exists()


def test_windows_run_value_is_one_quoted_command_line() -> None:
    cmd = ("C:\\Users\\Me\\AppData\\Local\\Programs\\Hearth\\Hearth.exe", "--background")
    assert windows_run_value(cmd) == cmd[0] + " --background"
    spaced = ("C:\\Program Files\\Hearth\\Hearth.exe", "--background")
    assert windows_run_value(spaced) == '"C:\\Program Files\\Hearth\\Hearth.exe" --background'
    a = Autostart(platform="win32", command=spaced)
    assert a.path is None
    assert a.location.endswith("\\Software\\Microsoft\\Windows\\CurrentVersion\\Run\\Hearth")
    assert a.content() == windows_run_value(spaced).encode()


@pytest.mark.skipif(sys.platform == "win32", reason="checks what happens off Windows")
def test_the_registry_is_never_touched_off_windows() -> None:
    a = Autostart(platform="win32")
    assert a.enabled() is False
    with pytest.raises(ConfigError):
        a.set_enabled(True)
    assert "winreg" not in sys.modules


def test_an_unwritable_folder_is_a_config_error(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the config folder should be")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(blocker))
    with pytest.raises(ConfigError, match="start at login"):
        Autostart(platform="linux").set_enabled(True)
