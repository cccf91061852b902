"""Where Hearth keeps things: one frozen dataclass, from platformdirs or HEARTH_HOME.
Tested by tests/test_settings.py and tests/gui/test_instance.py."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import platformdirs

APP_NAME = "Hearth"


@dataclass(frozen=True, slots=True)
class AppPaths:
    """Every folder Hearth writes to.

    ``HEARTH_HOME`` relocates all of them under one folder (tests, portable installs).
    """

    config: Path
    data: Path
    models: Path
    logs: Path
    cache: Path

    @property
    def settings_file(self) -> Path:
        return self.config / "settings.json"

    @property
    def library_file(self) -> Path:
        return self.data / "library.json"

    @property
    def server_file(self) -> Path:
        """The running server's address, so the CLI can find it."""
        return self.data / "server.json"

    @property
    def hf_token_file(self) -> Path:
        """The Hugging Face token (0600), kept out of settings.json."""
        return self.config / "hf_token"

    @property
    def aliases_file(self) -> Path:
        """Model aliases and fallback chains, kept out of settings.json."""
        return self.config / "aliases.json"

    @property
    def providers_file(self) -> Path:
        """Remote engines; their API keys live apart in provider_keys_file."""
        return self.config / "providers.json"

    @property
    def provider_keys_file(self) -> Path:
        """The providers' API keys (0600), never in settings.json or providers.json."""
        return self.config / "provider_keys.json"

    @property
    def mcp_file(self) -> Path:
        """MCP tool servers for the chat, in the common ``mcpServers`` notation."""
        return self.config / "mcp.json"

    @property
    def requests_db(self) -> Path:
        """The request records: SQLite, WAL mode."""
        return self.data / "requests.sqlite"

    @property
    def response_cache_db(self) -> Path:
        """The response cache: SQLite, WAL mode."""
        return self.data / "response_cache.sqlite"

    @property
    def responses_db(self) -> Path:
        """Stored Responses API responses (``store``): SQLite, WAL mode, 0600."""
        return self.data / "responses" / "responses.sqlite"

    @property
    def conversations_db(self) -> Path:
        """Saved chat conversations: SQLite, WAL mode."""
        return self.data / "conversations.sqlite"

    @property
    def keys_file(self) -> Path:
        """Named API keys: hashes, limits, model patterns, roles (0600)."""
        return self.config / "keys.json"

    @property
    def probe_file(self) -> Path:
        return self.cache / "runtime-probe.json"

    @classmethod
    def default(cls, home: str | os.PathLike[str] | None = None) -> AppPaths:
        home = home if home is not None else os.environ.get("HEARTH_HOME")
        if home:
            root = Path(home).expanduser().resolve()
            return cls(
                config=root / "config",
                data=root / "data",
                models=root / "models",
                logs=root / "logs",
                cache=root / "cache",
            )
        data = Path(platformdirs.user_data_dir(APP_NAME, appauthor=False))
        return cls(
            config=Path(platformdirs.user_config_dir(APP_NAME, appauthor=False)),
            data=data,
            models=data / "models",
            logs=Path(platformdirs.user_log_dir(APP_NAME, appauthor=False)),
            cache=Path(platformdirs.user_cache_dir(APP_NAME, appauthor=False)),
        )

    def ensure(self) -> AppPaths:
        for p in (self.config, self.data, self.models, self.logs, self.cache):
            p.mkdir(parents=True, exist_ok=True)
        return self
