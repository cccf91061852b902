"""Which failures move a fallback chain on to its next target.
Tested by tests/core/gateway/test_gateway.py and tests/server/gateway/test_gateway.py."""

from __future__ import annotations

from app.errors import HearthError, InsufficientMemory, ModelLoadFailed, QueueFull

# a local model that does not fit or fails to load, or whose queue is full: another target may
# serve; anything about the request itself (400, 401, 403, 404, 413, 422) would fail there too
_RETRYABLE: tuple[type[HearthError], ...] = (InsufficientMemory, ModelLoadFailed, QueueFull)


def is_retryable(err: HearthError) -> bool:
    """True when the next target of a chain should be tried after ``err`` (before any output).

    An error type may also say so itself with a ``retryable = True`` attribute (how a remote
    engine's connection errors and 429/5xx answers join in)."""
    return isinstance(err, _RETRYABLE) or bool(getattr(err, "retryable", False))
