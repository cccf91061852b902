"""Which models the caller may see (issue 14: a key restricted by ``--models`` patterns).

The server sets the scope for the duration of one request (a ContextVar: the request's task
and what it awaits); everything that resolves or lists models asks :func:`allowed`. Outside a
request (the GUI, the CLI, background work) there is no scope and every model is allowed."""

from __future__ import annotations

import contextlib
import fnmatch
from collections.abc import Callable, Iterable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TypeVar

from app.errors import ModelNotFound

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Scope:
    """Who the request runs for: the model patterns its key may use (None: every model) and
    its response-cache partition ("" for a request without a key: the GUI, no auth)."""

    patterns: tuple[str, ...] | None = None
    partition: str = ""


_UNSCOPED = Scope()
_SCOPE: ContextVar[Scope | None] = ContextVar("hearth_model_scope", default=None)


def _current() -> Scope:
    return _SCOPE.get() or _UNSCOPED


@contextlib.contextmanager
def scoped(patterns: Iterable[str] | None, partition: str = "") -> Iterator[None]:
    """Limit model resolution to ids matching any of ``patterns`` (None or empty: no limit),
    and file cached answers under ``partition``."""
    token = _SCOPE.set(Scope(tuple(patterns or ()) or None, partition))
    try:
        yield
    finally:
        _SCOPE.reset(token)


def active() -> bool:
    return _current().patterns is not None


def partition() -> str:
    """The caller's response-cache partition (a digest of its key's hash; "" without a key)."""
    return _current().partition


def allowed(model_id: str) -> bool:
    return in_scope(model_id, _current().patterns)


def in_scope(model_id: str, patterns: Iterable[str] | None) -> bool:
    """Whether ``model_id`` matches one of a key's ``patterns`` (None or none: every model)."""
    pats = tuple(patterns or ())
    return not pats or any(fnmatch.fnmatchcase(model_id, p) for p in pats)


def visible(items: Iterable[T], id_of: Callable[[T], str]) -> list[T]:
    return [i for i in items if allowed(id_of(i))]


def check(model_id: str) -> None:
    """Raise exactly what the library raises for an unknown id when ``model_id`` is out of scope."""
    if not allowed(model_id):
        raise ModelNotFound(f"The model '{model_id}' does not exist", param="model")
