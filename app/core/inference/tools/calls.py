"""What the streaming tool-call parser reports, and the narrow face its format blocks write to.

A block (``formats.py``) turns one family's call text into calls; it reports them through a
:class:`CallSink` (the parser) instead of reaching back into the parser that owns it.
Tested by tests/core/inference/tools/test_parser.py and tests/core/inference/test_reasoning.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


@dataclass
class StartedCall:
    """A call as the parser builds it (the whole call is :class:`app.core.types.ToolCall`)."""

    index: int
    id: str
    name: str
    arguments: str = ""


@dataclass
class ParseEvent:
    """What the parser found in a piece of streamed text."""

    text: str = ""  # text outside calls, before the first call started
    trailing: str = ""  # text outside calls once a call started (all of it past the last allowed)
    started: list[StartedCall] = field(default_factory=list)  # new calls: id/name, no arguments yet
    arguments: list[tuple[int, str]] = field(default_factory=list)  # (index, fragment)
    # the raw text of a call that broke (and what followed it): content, never a call
    broken: str = ""


class CallSink(Protocol):
    """Where a block reports the calls it reads: the parser, which numbers and bounds them."""

    family: str

    @property
    def exhausted(self) -> bool:
        """No further call is allowed (``max_calls`` reached)."""
        ...

    def start_call(self, name: str, ev: ParseEvent) -> StartedCall: ...

    def add_fragment(self, call: StartedCall, text: str, ev: ParseEvent) -> None: ...

    def end_call(self, ev: ParseEvent, broken: str | None = None) -> None: ...
