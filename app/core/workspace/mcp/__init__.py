"""MCP tool servers: mcp.json (config), the client sessions on the Hearth loop
(manager), results as tool-message text (results), and the chat's tool loop (toolloop)."""

from __future__ import annotations

from app.core.workspace.mcp.config import McpConfig, ServerConfig, load_config, parse_config
from app.core.workspace.mcp.manager import McpManager, McpTool, ServerStatus

__all__ = [
    "McpConfig",
    "McpManager",
    "McpTool",
    "ServerConfig",
    "ServerStatus",
    "load_config",
    "parse_config",
]
