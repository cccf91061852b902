"""Settings › MCP servers: mcp.json edited as text; bad JSON shows the error and leaves the file
as it was; a good one is written and the servers restart; the status list shows each server
(running N tools, or its error); Restart restarts one."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from pytestqt.qtbot import QtBot

from app.core.events import EventHub
from app.core.util.loop import LoopThread
from app.core.workspace.mcp import McpManager
from app.gui.bridge import Bridge
from app.gui.views.settings.mcp_servers import McpServersBox
from tests.gui.helpers import SLOW
from tests.support.mcp_fixtures import stdio_entry


@pytest.fixture
def setup(qtbot: QtBot, tmp_path: Path) -> Iterator[tuple[McpServersBox, McpManager, Path]]:
    loop = LoopThread("test-mcp-settings").start()
    cfg = tmp_path / "config" / "mcp.json"
    cfg.parent.mkdir()
    cfg.write_text('{"mcpServers": {}}\n')
    manager = McpManager(cfg)
    bridge = Bridge(loop, EventHub())
    box = McpServersBox(bridge, manager)
    qtbot.addWidget(box)
    qtbot.waitUntil(lambda: box.loaded, timeout=SLOW)
    try:
        yield box, manager, cfg
    finally:
        bridge.close()
        try:
            loop.call(manager.stop(), timeout=60)
        finally:
            loop.stop()


def statuses(box: McpServersBox) -> list[str]:
    return [box.status_list.item(i).text() for i in range(box.status_list.count())]


def test_bad_json_is_shown_and_the_file_is_untouched(
    setup: tuple[McpServersBox, McpManager, Path],
) -> None:
    box, _, cfg = setup
    assert box.editor.toPlainText() == '{"mcpServers": {}}\n'
    box.editor.setPlainText('{"mcpServers": {"x": ')
    assert not box.save()
    assert box.banner.kind == "error" and "not valid JSON" in box.banner.text()
    assert cfg.read_text() == '{"mcpServers": {}}\n'


def test_save_writes_restarts_and_lists_each_servers_state(
    setup: tuple[McpServersBox, McpManager, Path], qtbot: QtBot
) -> None:
    box, manager, cfg = setup
    text = json.dumps(
        {"mcpServers": {"local": stdio_entry(), "ghost": {"command": str(cfg.parent / "nope")}}}
    )
    box.editor.setPlainText(text)
    qtbot.mouseClick(box.save_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(
        lambda: box.save_button.isEnabled() and box.status_list.count() == 2, timeout=SLOW
    )
    assert json.loads(cfg.read_text()) == json.loads(text)
    local, ghost = statuses(box)
    assert local.startswith("local: running · ") and local.endswith(" tools")
    assert ghost.startswith("ghost: error: cannot start")
    assert box.banner.kind == "error" and "ghost" in box.banner.text()
    pid = int(box._bridge._loop.call(manager.call("local__pid", {}), timeout=60).content)

    box.status_list.setCurrentRow(0)
    qtbot.mouseClick(box.restart_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: box.restart_button.isEnabled(), timeout=SLOW)
    new_pid = int(box._bridge._loop.call(manager.call("local__pid", {}), timeout=60).content)
    assert new_pid != pid and statuses(box)[0].startswith("local: running")
