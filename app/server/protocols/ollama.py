"""Ollama's API: bodies -> requests, deltas -> NDJSON lines (pure, no aiohttp)."""

from __future__ import annotations

from typing import Any

from app.errors import HearthError
from app.server.protocols.base import Protocol


def error_body(err: HearthError) -> dict[str, Any]:
    return {"error": err.message}


class Ollama(Protocol):
    name = "ollama"

    def error_body(self, err: HearthError) -> dict[str, Any]:
        return error_body(err)
