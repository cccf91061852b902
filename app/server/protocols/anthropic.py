"""Anthropic Messages: body -> ChatRequest, deltas -> message events (pure, no aiohttp)."""

from __future__ import annotations

from typing import Any

from app.errors import HearthError
from app.server.protocols.base import Protocol

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    504: "timeout_error",
}


def error_body(err: HearthError) -> dict[str, Any]:
    return {
        "type": "error",
        "error": {"type": ERROR_TYPES.get(err.status, "api_error"), "message": err.message},
    }


class Anthropic(Protocol):
    name = "anthropic"

    def error_body(self, err: HearthError) -> dict[str, Any]:
        return error_body(err)
