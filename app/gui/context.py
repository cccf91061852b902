"""What the composition root hands the GUI: the running core and its collaborators.
Tested by tests/gui/test_tray.py and tests/gui/test_bridge.py."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.core.service import Hearth
from app.core.util.loop import LoopThread
from app.paths import AppPaths
from app.server.runner import ServerController
from app.settings import SettingsStore


@dataclass(frozen=True)
class GuiContext:
    """Everything the windows need; built by ``app.cli`` (or a test) and passed to ``run_gui``.

    Attributes:
        service: the core façade; its coroutines run on ``loop``.
        loop: the started service thread.
        settings_store: the shared settings file.
        paths: the data folders (also names the single-instance socket).
        server: the embedded API server's controller (its coroutines run on ``loop`` too).
        mcp: the chat's MCP servers (app.core.workspace.mcp.McpManager; None: no MCP tools).
    """

    service: Hearth
    loop: LoopThread
    settings_store: SettingsStore
    paths: AppPaths
    server: ServerController
    mcp: Any = None
