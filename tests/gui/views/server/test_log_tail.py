"""The Server page's App log tab follows logs/hearth.log: appends, a rotation, a missing file, and
a bounded number of lines."""

from __future__ import annotations

from pathlib import Path

from pytestqt.qtbot import QtBot

from app.gui.context import GuiContext
from app.gui.main_window import MainWindow
from app.gui.views.server.log_tail import MAX_LINES


def append(path: Path, *lines: str) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.writelines(line + "\n" for line in lines)


def test_the_app_log_tab_follows_appends_rotation_and_a_missing_file(
    window: MainWindow, qtbot: QtBot, gui_ctx: GuiContext
) -> None:
    window.show_page("Server")
    page = window.server_page
    tail = page.log_tail
    page.logs.setCurrentWidget(tail)
    log_file = gui_ctx.paths.logs / "hearth.log"
    log_file.unlink(missing_ok=True)
    qtbot.waitUntil(lambda: "No log file yet" in tail.status.text(), timeout=10_000)

    append(log_file, "first line", "second line")
    qtbot.waitUntil(lambda: tail.lines()[-2:] == ["first line", "second line"], timeout=10_000)
    append(log_file, "third line")
    qtbot.waitUntil(lambda: tail.lines()[-1] == "third line", timeout=10_000)
    assert tail.lines().count("first line") == 1  # appends are read once

    # a rotation: the file is renamed away and a new one started
    log_file.rename(log_file.with_name("hearth.log.1"))
    append(log_file, "after rotation")
    qtbot.waitUntil(lambda: tail.lines()[-1] == "after rotation", timeout=10_000)
    assert "third line" in tail.lines()

    log_file.unlink()
    qtbot.waitUntil(lambda: "No log file yet" in tail.status.text(), timeout=10_000)
    append(log_file, *(f"line {i}" for i in range(MAX_LINES + 200)))
    qtbot.waitUntil(lambda: tail.lines()[-1] == f"line {MAX_LINES + 199}", timeout=10_000)
    assert len(tail.lines()) <= MAX_LINES
    assert "Following" in tail.status.text()
