"""Every route table of the server, thin aiohttp handlers. One module per wire API (openai,
responses, anthropic, ollama): read the body, let the protocol adapter make the request, call the
service, answer through the one streaming path. Hearth's own API under /api/v1/: native (models,
load, presets), downloads, manage (keys, providers), metrics; health is /health's state."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aiohttp import web

from app.server.protocols.base import Protocol

PROTOCOL_ATTR = "hearth_protocol"


class ProtocolRoutes(web.RouteTableDef):
    """A route table whose handlers belong to one protocol: its errors are answered in that
    protocol's shape, whatever the path looks like."""

    def __init__(self, protocol: Protocol) -> None:
        super().__init__()
        self.protocol = protocol

    def route(self, method: str, path: str, **kwargs: Any) -> Callable[[Any], Any]:
        register = super().route(method, path, **kwargs)

        def deco(handler: Any) -> Any:
            setattr(handler, PROTOCOL_ATTR, self.protocol)
            return register(handler)

        return deco


def owner(handler: Any) -> Protocol | None:
    """The protocol a matched route's handler belongs to (None: not one of ours)."""
    return getattr(handler, PROTOCOL_ATTR, None)
