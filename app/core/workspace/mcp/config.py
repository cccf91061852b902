"""mcp.json in the common notation (Claude Desktop, Cursor, LM Studio):
``{"mcpServers": {"NAME": {"command", "args", "env", "cwd"} | {"url", "headers"}, "disabled"}}``.
A bad entry is reported by its name and the others still start; ``${VAR}`` in env values,
headers and args is replaced from Hearth's own environment (unset: empty).
Tested by tests/core/workspace/mcp/test_manager.py and tests/core/workspace/mcp/test_toolloop.py."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.errors import ConfigError

_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """One server: stdio (``command``) or Streamable HTTP (``url``)."""

    name: str
    command: str = ""
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None
    url: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    disabled: bool = False

    @property
    def transport(self) -> str:
        return "http" if self.url else "stdio"


@dataclass(frozen=True, slots=True)
class McpConfig:
    """The servers that parsed, and an error text per entry that did not (by name)."""

    servers: tuple[ServerConfig, ...] = ()
    errors: dict[str, str] = field(default_factory=dict)


def expand(value: str, environ: Mapping[str, str]) -> str:
    return _VAR.sub(lambda m: environ.get(m.group(1), ""), value)


def _strings(value: Any, what: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise ValueError(f'"{what}" must be an object of strings')
    return dict(value)


def _server(name: str, raw: Any, environ: Mapping[str, str]) -> ServerConfig:
    if not isinstance(raw, dict):
        raise ValueError("must be an object")
    disabled = raw.get("disabled", False)
    if not isinstance(disabled, bool):
        raise ValueError('"disabled" must be true or false')
    command, url = raw.get("command"), raw.get("url")
    if command is not None and url is not None:
        raise ValueError('has both "command" and "url": pick one')
    if url is not None:
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ValueError('"url" must be an http:// or https:// address')
        headers = {
            k: expand(v, environ) for k, v in _strings(raw.get("headers"), "headers").items()
        }
        return ServerConfig(name, url=url, headers=headers, disabled=disabled)
    if not isinstance(command, str) or not command.strip():
        raise ValueError('needs "command" (a stdio server) or "url" (a Streamable HTTP server)')
    args = raw.get("args", [])
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise ValueError('"args" must be a list of strings')
    cwd = raw.get("cwd")
    if cwd is not None and not isinstance(cwd, str):
        raise ValueError('"cwd" must be a string')
    env = {k: expand(v, environ) for k, v in _strings(raw.get("env"), "env").items()}
    return ServerConfig(
        name,
        command=command,
        args=tuple(expand(a, environ) for a in args),
        env=env,
        cwd=os.path.expanduser(cwd) if cwd else None,
        disabled=disabled,
    )


def parse_config(text: str, environ: Mapping[str, str] | None = None) -> McpConfig:
    """Parse mcp.json's text. Raises ConfigError when the file as a whole is unusable (bad
    JSON, no ``mcpServers`` object); a bad entry only lands in ``errors``."""
    env = os.environ if environ is None else environ
    if not text.strip():
        return McpConfig()
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(
            f"mcp.json is not valid JSON: {e.msg} (line {e.lineno}, column {e.colno})"
        ) from e
    if not isinstance(data, dict):
        raise ConfigError('mcp.json must be an object: {"mcpServers": {...}}')
    servers = data.get("mcpServers", {})
    if not isinstance(servers, dict):
        raise ConfigError('"mcpServers" in mcp.json must be an object of servers by name')
    out: list[ServerConfig] = []
    errors: dict[str, str] = {}
    for name, raw in servers.items():
        if not name.strip():
            errors[name] = "a server needs a name"
            continue
        try:
            out.append(_server(name, raw, env))
        except ValueError as e:
            errors[name] = f"server {name!r}: {e}"
    return McpConfig(tuple(out), errors)


def load_config(path: Path) -> McpConfig:
    """mcp.json from disk; a missing file is no servers."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return McpConfig()
    except OSError as e:
        raise ConfigError(f"cannot read {path}: {e}") from e
    return parse_config(text)
