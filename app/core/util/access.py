"""Which models a caller may see: a key restricted by ``--models`` patterns.

The patterns travel on the request (``RequestContext.models``) or are passed by the route that
lists models; ``None`` (the GUI, the CLI, a server without keys) allows every model. An id out
of scope is answered exactly as an unknown one, so a key cannot learn that a model exists.
Tested by tests/core/gateway/test_keys.py."""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Iterable
from typing import TypeVar

from app.errors import ModelNotFound

T = TypeVar("T")

Patterns = tuple[str, ...] | None


def in_scope(model_id: str, patterns: Iterable[str] | None) -> bool:
    """Whether ``model_id`` matches one of a key's ``patterns`` (None or none: every model)."""
    pats = tuple(patterns or ())
    return not pats or any(fnmatch.fnmatchcase(model_id, p) for p in pats)


def visible(
    items: Iterable[T], id_of: Callable[[T], str], patterns: Iterable[str] | None
) -> list[T]:
    """The ``items`` whose id is in scope."""
    pats = tuple(patterns or ())
    return [i for i in items if in_scope(id_of(i), pats)]


def check(model_id: str, patterns: Iterable[str] | None) -> None:
    """Raise exactly what the library raises for an unknown id when ``model_id`` is out of scope."""
    if not in_scope(model_id, patterns):
        raise ModelNotFound(f"The model '{model_id}' does not exist", param="model")
