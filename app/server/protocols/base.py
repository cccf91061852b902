"""What every protocol adapter gives the one streaming path: frames to write, a whole answer,
and its error shape. Pure: no aiohttp here (an import-linter contract checks it), so adapters
are tested on recorded delta sequences without a model or a server.
Tested by tests/server/protocols/ollama/test_adapter.py and
tests/server/protocols/openai/test_adapter.py."""

from __future__ import annotations

import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from app.core.inference.generation import Completion
from app.core.types import Delta
from app.errors import HearthError

Framing = Literal["sse", "ndjson"]


@dataclass(frozen=True, slots=True)
class Frame:
    """One thing written on a stream: an SSE event (``event`` name, optional) or an NDJSON line.
    ``data`` is JSON-able, or a str written as it is (``[DONE]``)."""

    data: Any
    event: str | None = None


@dataclass
class Context:
    """What rendering needs besides the request and the deltas: the model name as the client
    sent it, ids and times, and the server's rendering options."""

    model: str
    created: float = field(default_factory=time.time)
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    reasoning_also: bool = False  # OpenAI: also write `reasoning` beside `reasoning_content`
    load_ns: int = 0  # Ollama: how long the model took to load for this request
    started_ns: int = field(default_factory=time.perf_counter_ns)


class StreamRenderer(ABC):
    """Turns one request's deltas into its protocol's stream, choice by choice. Each method
    returns the frames to write (possibly none). Called in order: :meth:`open`, then per choice
    :meth:`delta`... and :meth:`end_choice`, then :meth:`close`; or :meth:`error` at any point
    after :meth:`open` (and nothing after it)."""

    framing: Framing = "sse"

    def open(self) -> list[Frame]:
        return []

    @abstractmethod
    def delta(self, i: int, d: Delta) -> list[Frame]:
        """A delta of choice ``i`` that is not its last (text, reasoning, tool calls, logprobs)."""

    @abstractmethod
    def end_choice(self, i: int, final: Delta) -> list[Frame]:
        """Choice ``i``'s final delta (it may carry text too), after a normal finish."""

    def close(self, finals: Sequence[Delta]) -> list[Frame]:
        return []

    @abstractmethod
    def error(self, err: HearthError) -> list[Frame]:
        """The stream broke after it started (a time limit, an unload, a runtime error)."""


class Protocol(ABC):
    """One wire API's error shape (the middleware asks the route's owner)."""

    name: str

    @abstractmethod
    def error_body(self, err: HearthError) -> dict[str, Any]: ...


def whole(results: Sequence[Completion]) -> list[Delta]:
    """The final deltas of whole results (usage, timings, finish reasons)."""
    return [r.final for r in results]
