"""Which models the caller may see (issue 14: a key restricted by ``--models`` patterns).

The server sets the scope for the duration of one request (a ContextVar: the request's task
and what it awaits); everything that resolves or lists models asks :func:`allowed`. Outside a
request (the GUI, the CLI, background work) there is no scope and every model is allowed."""

from __future__ import annotations

import contextlib
import fnmatch
from collections.abc import Callable, Iterable, Iterator
from contextvars import ContextVar
from typing import TypeVar

from app.errors import ModelNotFound

T = TypeVar("T")

_SCOPE: ContextVar[tuple[str, ...] | None] = ContextVar("hearth_model_scope", default=None)


@contextlib.contextmanager
def scoped(patterns: Iterable[str] | None) -> Iterator[None]:
    """Limit model resolution to ids matching any of ``patterns`` (None or empty: no limit)."""
    pats = tuple(patterns or ()) or None
    token = _SCOPE.set(pats)
    try:
        yield
    finally:
        _SCOPE.reset(token)


def active() -> bool:
    return _SCOPE.get() is not None


def allowed(model_id: str) -> bool:
    pats = _SCOPE.get()
    return pats is None or any(fnmatch.fnmatchcase(model_id, p) for p in pats)


def visible(items: Iterable[T], id_of: Callable[[T], str]) -> list[T]:
    return [i for i in items if allowed(id_of(i))]


def check(model_id: str) -> None:
    """Raise exactly what the library raises for an unknown id when ``model_id`` is out of scope."""
    if not allowed(model_id):
        raise ModelNotFound(f"The model '{model_id}' does not exist", param="model")
