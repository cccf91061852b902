"""The gateway: what a request's ``model`` names (a local id, an alias, ``auto``, nothing) and
which targets are tried, in order (aliases store, resolution, ``auto`` rules, retry classes)."""

from __future__ import annotations

from app.core.gateway.aliases import AliasStore
from app.core.gateway.auto import AUTO, AutoRule, RequestFacts, parse_rules
from app.core.gateway.resolve import Gateway, Routing
from app.core.gateway.retry import is_retryable

__all__ = [
    "AUTO",
    "AliasStore",
    "AutoRule",
    "Gateway",
    "RequestFacts",
    "Routing",
    "is_retryable",
    "parse_rules",
]
