"""The streaming tool-call parser: text in, text and tool-call deltas out, per family.
Tested by tests/core/inference/tools/test_parser.py, tests/core/inference/tools/test_repeat.py and
tests/core/inference/tools/test_transcripts.py."""

from __future__ import annotations

import json
import logging
import uuid
from typing import Any

from app.core.inference.tools.calls import ParseEvent, StartedCall
from app.core.inference.tools.formats import (
    FED,
    INCOMPLETE,
    NOT_A_CALL,
    OVER,
    UNKNOWN,
    Block,
    open_block,
)
from app.core.inference.tools.spec import FAMILIES

log = logging.getLogger(__name__)


def _new_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


# (start marker, end marker) of one call block, per family
BLOCKS = {
    "hermes": ("<tool_call>", "</tool_call>"),
    "qwen3coder": ("<tool_call>", "</tool_call>"),
    "mistral": ("[TOOL_CALLS]", None),
    "llama3": ("<|python_tag|>", None),
    "harmony": ("<|channel|>commentary to=functions.", "<|call|>"),
    "deepseek": ("<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>"),
    "glm": ("<tool_call>", "</tool_call>"),
    "kimi": ("<|tool_call_begin|>", "<|tool_call_end|>"),
    "granite": ("<|tool_call|>", None),
}
# the marker that opens a family's section of call blocks: part of the first block's opener
SECTIONS = {
    "deepseek": "<｜tool▁calls▁begin｜>",
    "kimi": "<|tool_calls_section_begin|>",
}


class ToolCallParser:
    """Streams text through and turns the family's call blocks into tool-call deltas as they grow.

    Text that may be the start of a call marker is held back. Inside a block, a call is started
    (id and name) as soon as its name is complete, and its arguments follow in fragments as the
    model writes them; only a possible end marker and what cannot yet be judged (a key, a comma,
    a number, an escape sequence) are held back. Concatenated, a call's fragments are the text of
    a JSON object: the arguments object's own text, or the decoded content of arguments given as
    a JSON string (``"arguments": "{\\"a\\": 1}"``). Arguments written before the name are held
    until the name is known. The JSON formats are validated as they stream, so what was sent is
    always a well-formed prefix.

    Malformed blocks:
    - before any call of the block started, the block is passed through as text (as when whole);
    - after a call started (a bad token, a block or stream that ends mid-call), the call is ended
      with what was streamed: the fragments are completed into a valid object (open strings and
      containers closed; ``{}`` when nothing was sent) and the rest of the block is dropped. In
      formats without an end marker (mistral, llama3) the block ends there and the rest is text.

    With ``names`` (the tools the request offers), a call of any other tool is never announced:
    when its block ends it breaks the calls with ``unknown_tool`` (its text is content).

    Text outside calls goes to ``ParseEvent.text`` until the first call starts and to
    ``ParseEvent.trailing`` after. With ``max_calls``, once that many calls are closed the parser
    is ``exhausted``: no further call starts and everything after is trailing.

    With ``end_on_repeat`` (a forced call, where a small model's grammar-bound output tends to
    loop), a call with the same name and the same arguments (as parsed JSON) as an earlier call
    ends the calls: it is dropped, ``repeated`` is set and the parser is ``exhausted``. A call
    whose name an earlier call has is held (nothing of it in the events) until it closes, so a
    repeat is never announced; a call under a new name streams at once.

    A call that started but was not finished correctly (its block or the stream ended first:
    ``incomplete``; its arguments stopped being JSON: ``malformed_arguments``) ends the calls
    too: its block's raw text and all text after it go to ``ParseEvent.broken`` (content, not a
    call), ``broken`` names the reason and ``broken_index`` the call if it was announced (its
    deltas, closed into a valid object, went out before the break was known).
    """

    def __init__(
        self,
        family: str,
        *,
        max_calls: int | None = None,
        end_on_repeat: bool = False,
        names: frozenset[str] | None = None,
    ) -> None:
        self.family = family if family in FAMILIES else "hermes"
        self.start, self.end = BLOCKS[self.family]
        # a section marker right before the first block is part of it, never content
        self.section = SECTIONS.get(self.family, "")
        self.names = names
        self.max_calls = max_calls
        self.end_on_repeat = end_on_repeat
        self._buf = ""
        self._block: Block | None = None
        self.calls: list[StartedCall] = []
        self.closed = 0  # calls whose arguments are complete
        self.repeated = False  # a call repeated an earlier one: the calls ended there
        self.broken: str | None = None  # why a started call was not finished correctly
        self.broken_index: int | None = None  # that call, if its start was announced
        self._held: ParseEvent | None = None  # the open call's events, until it is known new
        self._answer_started = False

    @property
    def exhausted(self) -> bool:
        """The last allowed call is closed, or a call repeated: nothing more can be a call."""
        if self.repeated or self.broken is not None:
            return True
        return self.max_calls is not None and self.closed >= self.max_calls

    def feed(self, text: str) -> ParseEvent:
        ev = ParseEvent()
        self._buf += text
        self._run(ev, final=False)
        return ev

    def flush(self) -> ParseEvent:
        ev = ParseEvent()
        self._run(ev, final=True)
        return ev

    def _run(self, ev: ParseEvent, *, final: bool) -> None:
        while True:
            if self.exhausted:
                if self.broken is not None:
                    ev.broken += self._buf
                else:
                    ev.trailing += self._buf
                self._buf, self._block = "", None
                return
            block = self._block
            if not (self._text(ev, final) if block is None else self._in_block(block, ev, final)):
                return

    def _text(self, ev: ParseEvent, final: bool) -> bool:
        """Pass text through up to the next block; True when one opened."""
        buf = self._buf
        i = buf.find(self.start)
        if i == -1 and self.family == "llama3" and not self._answer_started:
            j = len(buf) - len(buf.lstrip())
            if buf[j : j + 1] == "{":  # Llama 3.x also answers calls as a bare JSON object
                self._open("", buf[j:])
                return True
        if i == -1:
            hold = 0 if final else _partial(buf, self.start)
            if self.section and not final:
                hold = max(hold, _partial(buf, self.section + self.start))
            out = buf[: len(buf) - hold]
            if self.family == "llama3" and not self._answer_started and not out.strip():
                if not final:
                    return False  # wait: a bare JSON call may follow the whitespace
            self._say(out, ev)
            self._buf = buf[len(buf) - hold :]
            return False
        opener = self.start
        if self.section and buf[:i].endswith(self.section):
            i -= len(self.section)
            opener = self.section + self.start
        self._say(buf[:i], ev)
        self._open(opener, buf[i + len(opener) :])
        return True

    def _in_block(self, block: Block, ev: ParseEvent, final: bool) -> bool:
        """Feed the open block what can be judged now; True when it ended."""
        buf, marker = self._buf, ""  # marker: the end marker, once seen
        if self.end is None:
            chunk, rest = buf, ""
        elif (j := buf.find(self.end)) != -1:
            chunk, rest, marker = buf[:j], buf[j + len(self.end) :], self.end
        else:
            hold = 0 if final else _partial(buf, self.end)
            chunk, rest = buf[: len(buf) - hold], buf[len(buf) - hold :]
        status, used = block.feed(chunk, ev) if chunk else (FED, 0)
        if self.broken is not None:  # the block as written so far; the rest follows it
            ev.broken += block.opener + block.raw
            self._buf = chunk[used:] + marker + rest
            self._block = None
            return True
        if self.exhausted:  # the rest of the block, its end marker included, is past the limit
            self._buf = block.leftover + chunk[used:] + marker + rest
            return True
        if status == NOT_A_CALL:
            self._block = None
            self._say(block.opener + block.raw, ev)
            self._buf = chunk[used:] + marker + rest
            return True
        if status == OVER:
            if self.end is None:  # the block ends here; what follows is text again
                self._block = None
                self._buf = block.leftover + chunk[used:] + rest
                return True
            log.info("%s tool call malformed; dropped the rest of its block", self.family)
        if not (marker or final):
            self._buf = rest
            return False
        self._block = None
        self._buf = rest
        block.marker_seen = bool(marker)
        if not block.close(ev):
            self._say(block.opener + block.raw + marker, ev)
            if final and not marker and block.opener:  # cut inside a call block: say so
                self.broken = INCOMPLETE
        elif self.broken is not None:
            ev.broken += block.opener + block.raw + marker
        return True

    def _open(self, opener: str, rest: str) -> None:
        self._buf = rest
        self._block = open_block(self, opener)

    def _say(self, text: str, ev: ParseEvent) -> None:
        if self.calls:
            ev.trailing += text
        else:
            ev.text += text
        self._answer_started = self._answer_started or bool(text.strip())

    def start_call(self, name: str, ev: ParseEvent) -> StartedCall:
        """(for blocks) A new call named ``name``, announced in ``ev`` (or held, see the class)."""
        call = StartedCall(len(self.calls), _new_id(), name)
        unknown = self.names is not None and name not in self.names
        if unknown or self.end_on_repeat and any(c.name == name for c in self.calls):
            self._held = ev = ParseEvent()
        self.calls.append(call)
        ev.started.append(StartedCall(call.index, call.id, call.name))
        return call

    def end_call(self, ev: ParseEvent, broken: str | None = None) -> None:
        """(for blocks) The call last started has its complete arguments, or ``broken`` says
        why it was not finished correctly."""
        held, self._held = self._held, None
        if self.names is not None and self.calls[-1].name not in self.names:
            broken = UNKNOWN  # the client cannot run it: it is the text the model wrote
        if broken is not None:
            log.info(
                "%s tool call %s: %s; returned as text", self.family, self.calls[-1].name, broken
            )
            self.broken = broken
            if held is None:
                self.broken_index = self.calls[-1].index
            else:  # never announced: no trace of it as a call
                self.calls.pop()
            return
        if held is not None:
            call = self.calls[-1]
            if any(_same(call, c) for c in self.calls[:-1]):
                log.info("tool call %s repeated an earlier call; the calls end here", call.name)
                self.calls.pop()
                self.repeated = True
                return
            ev.started += held.started
            for i, frag in held.arguments:
                self._merge(i, frag, ev)
        self.closed += 1

    def add_fragment(self, call: StartedCall, text: str, ev: ParseEvent) -> None:
        """(for blocks) Append ``text`` to the arguments of ``call``, merged in ``ev`` per call."""
        if not text:
            return
        call.arguments += text
        self._merge(call.index, text, self._held if self._held is not None else ev)

    @staticmethod
    def _merge(index: int, text: str, ev: ParseEvent) -> None:
        if ev.arguments and ev.arguments[-1][0] == index:
            ev.arguments[-1] = (index, ev.arguments[-1][1] + text)
        else:
            ev.arguments.append((index, text))


def _same(a: StartedCall, b: StartedCall) -> bool:
    """Same name and the same arguments, compared as parsed JSON (spacing and key order aside)."""
    return a.name == b.name and _parsed(a.arguments) == _parsed(b.arguments)


def _parsed(arguments: str) -> Any:
    try:
        return json.loads(arguments or "{}")
    except ValueError:
        return arguments


def _partial(buf: str, marker: str) -> int:
    for k in range(min(len(marker) - 1, len(buf)), 0, -1):
        if buf.endswith(marker[:k]):
            return k
    return 0
