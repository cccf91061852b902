"""The call blocks of each family's format, parsed as they stream: :class:`JsonCalls` for hermes,
mistral, llama3 and granite, :class:`HeaderCall` for harmony, deepseek, kimi and mistral's
``NAME[ARGS]{...}`` form, :class:`XmlCall` for qwen3coder and :class:`KeyValueCall` for glm.
Tested by tests/core/inference/tools/test_parser.py and
tests/core/inference/tools/test_transcripts.py.
"""

from __future__ import annotations

import json
import logging
import re
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

from app.core.inference.tools.scanner import (
    AFTER,
    BAD,
    MORE,
    WS,
    ArgsValue,
    JsonScanner,
    StringDecoder,
)
from app.core.inference.tools.whole import parse_block, typed_value

if TYPE_CHECKING:
    from app.core.inference.tools.calls import CallSink, ParseEvent, StartedCall

log = logging.getLogger(__name__)

# what a block reports back after a piece of its text
FED = 0  # taken in; more may come
NOT_A_CALL = 1  # malformed before any call started: give the block back as text
OVER = 2  # malformed (or done, for formats without an end marker) after a call started
_WHOLE = 3  # (inside JsonCalls) not JSON: parse the block whole when it ends
_NOT_A_CALL_INCL = 4  # (inside JsonCalls) NOT_A_CALL, this character included

# why a started call was not finished correctly (the parser returns its text instead)
INCOMPLETE = "incomplete"  # its block or the stream ended before the call was whole
MALFORMED = "malformed_arguments"  # its arguments stopped being valid JSON
UNKNOWN = "unknown_tool"  # it names a tool the request did not offer


class Block(ABC):
    """One call block's text after its start marker, turned into calls as it arrives."""

    def __init__(self, parser: CallSink, opener: str) -> None:
        self.parser = parser
        self.opener = opener  # the marker that opened the block ("" for a bare JSON call)
        self.raw = ""  # the block's text taken so far: given back as text when it is no call
        self.leftover = ""  # taken text that goes back to the stream when the block is OVER
        self.marker_seen = False  # (set by the parser) the block ended at its end marker

    @abstractmethod
    def feed(self, chunk: str, ev: ParseEvent) -> tuple[int, int]:
        """Take ``chunk`` in: (FED | NOT_A_CALL | OVER, characters of it used)."""

    @abstractmethod
    def close(self, ev: ParseEvent) -> bool:
        """The block ended: finish an open call. False when the block holds no call at all."""


class JsonCalls(Block):
    """hermes, mistral, llama3 and granite: call objects ``{"name": ..., "arguments" | "parameters": ...}``,
    one or several, bare, in a list, or separated by ``;`` and ``,``."""

    def __init__(self, parser: CallSink, opener: str, *, python_tag: bool) -> None:
        super().__init__(parser, opener)
        self._python_tag = python_tag  # <|python_tag|>name.call(k="v") is parsed whole at the end
        self._whole = False
        self._stopped = False
        self._mode = "top"
        self._in_list = False
        self._calls = 0  # calls started in this block
        self._new_object()

    def _new_object(self) -> None:
        self._call: StartedCall | None = None
        self._first = True
        self._key = ""
        self._str = StringDecoder()
        self._parts: list[str] = []
        self._args = ArgsValue()  # fresh: no arguments member, closing() gives {}
        self._args_seen = False
        self._early: list[str] = []  # arguments text seen before the name
        self._skip = JsonScanner()

    def feed(self, chunk: str, ev: ParseEvent) -> tuple[int, int]:
        if self._stopped or self._whole:
            self.raw += chunk
            return FED, len(chunk)
        for i, ch in enumerate(chunk):
            try:
                status = self._step(ch, ev)
            except ValueError:
                status = self._bad(ev)
            if status is None:
                continue
            self._drain(ev)
            if status == _WHOLE:
                self._whole = True
                self.raw += chunk
                return FED, len(chunk)
            used = i + 1 if status == _NOT_A_CALL_INCL else i
            self.raw += chunk[:used]
            if status == OVER:
                self._stopped = True
                return OVER, used
            return NOT_A_CALL, used
        self.raw += chunk
        self._drain(ev)
        return FED, len(chunk)

    def close(self, ev: ParseEvent) -> bool:
        if self._whole:
            try:
                parsed = parse_block("llama3", self.raw)
            except ValueError:
                return False
            for name, args in parsed:
                if self.parser.exhausted:
                    break
                self.parser.add_fragment(self.parser.start_call(name, ev), args, ev)
                self.parser.end_call(ev)
            return True
        if self._call is not None:
            self._finish(self._call, ev, broken=INCOMPLETE)
        return self._calls > 0

    def _step(self, ch: str, ev: ParseEvent) -> int | None:
        mode = self._mode
        if mode in ("key", "name"):
            text = self._str.push(ch)
            self._parts.append(text)
            if self._str.closed:
                value, self._parts, self._str = "".join(self._parts), [], StringDecoder()
                if mode == "key":
                    self._key, self._mode = value, "colon"
                else:
                    self._begin(value, ev)
            return None
        if mode == "args":
            r = self._args.push(ch)
            if r == BAD:
                return self._bad(ev)
            if r != MORE:
                self._mode = "after"
            return self._step(ch, ev) if r == AFTER else None
        if mode == "skip":
            r = self._skip.push(ch)
            if r == BAD:
                return self._bad(ev)
            if r != MORE:
                self._mode = "after"
            return self._step(ch, ev) if r == AFTER else None
        if mode == "top":
            return self._top(ch)
        if ch in WS:
            return None
        if mode == "obj":  # a key, or the end of an empty object
            if ch == '"':
                self._mode = "key"
                return None
            return self._end_object(ev) if ch == "}" and self._first else self._bad(ev)
        if mode == "colon":
            if ch != ":":
                return self._bad(ev)
            self._mode = "value"
            return None
        if mode == "value":
            return self._value(ch, ev)
        # after a member
        if ch == ",":
            self._mode, self._first = "obj", False
            return None
        return self._end_object(ev) if ch == "}" else self._bad(ev)

    def _top(self, ch: str) -> int | None:
        if self.parser.exhausted:  # no call after the last allowed one, even in this block
            return OVER
        if ch in ";," or ch in WS:
            self.leftover += ch  # between calls; text again if no call follows
            return None
        if ch == "{":
            self._mode, self.leftover = "obj", ""
            return None
        if ch == "[" and not self._in_list or ch == "]" and self._in_list:
            self._in_list, self.leftover = ch == "[", ""
            return None
        if self._python_tag and not self._calls and not self._in_list:
            return _WHOLE
        return OVER if self._calls else NOT_A_CALL

    def _value(self, ch: str, ev: ParseEvent) -> int | None:
        if self._key == "name" and self._call is None:
            if ch != '"':
                return self._bad(ev)
            self._mode = "name"
            return None
        if self._key in ("arguments", "parameters") and not self._args_seen:
            self._args_seen, self._mode = True, "args"
        else:  # another member, or a second arguments member: skipped
            self._skip, self._mode = JsonScanner(), "skip"
        return self._step(ch, ev)

    def _begin(self, name: str, ev: ParseEvent) -> None:
        self._drain(ev)
        self._call = self.parser.start_call(name, ev)
        self._calls += 1
        self.parser.add_fragment(self._call, "".join(self._early), ev)
        self._early.clear()
        self._mode = "after"

    def _drain(self, ev: ParseEvent) -> None:
        text = self._args.take()
        if self._call is not None:
            self.parser.add_fragment(self._call, text, ev)
        elif text:
            self._early.append(text)

    def _finish(self, call: StartedCall, ev: ParseEvent, broken: str | None = None) -> None:
        self._drain(ev)
        self.parser.add_fragment(call, self._args.closing(), ev)
        self.parser.end_call(ev, broken)
        self._new_object()

    def _end_object(self, ev: ParseEvent) -> int | None:
        self._mode = "top"
        if self._call is not None:
            self._finish(self._call, ev)
            return None
        self._new_object()
        if not self._calls:
            return _NOT_A_CALL_INCL  # an object without a name: this block is no call
        log.info("%s tool call without a name skipped", self.parser.family)
        return None

    def _bad(self, ev: ParseEvent) -> int:
        if self._call is not None:
            self._finish(self._call, ev, broken=MALFORMED)
        return OVER if self._calls else NOT_A_CALL


# harmony, deepseek, kimi and mistral (tokenizer v11+): the header that names the call, then the
# arguments as JSON; deepseek V3/R1 writes "function<sep>NAME" and a json fence, V3.1 "NAME<sep>"
HEADERS = {
    "harmony": re.compile(r"\s*([\w.-]+)\s*(?:<\|constrain\|>\s*json)?\s*<\|message\|>"),
    "deepseek": re.compile(
        r"\s*(?:function<｜tool▁sep｜>([^\n]+)\n```(?:json)?\n"
        r"|(?!function<｜tool▁sep｜>)([^\s<｜]+)<｜tool▁sep｜>)"
    ),
    "kimi": re.compile(r"\s*(?:functions\.)?([^\s:<]+)(?::\d+)?\s*<\|tool_call_argument_begin\|>"),
    "mistral": re.compile(r"\s*([\w.-]+)(?:\[CALL_ID\]\w+)?\[ARGS\]"),
}


class OneCall(Block):
    """A block that holds at most one call, ended by ``_finish`` (once)."""

    def __init__(self, parser: CallSink, opener: str) -> None:
        super().__init__(parser, opener)
        self._call: StartedCall | None = None
        self._done = False

    def close(self, ev: ParseEvent) -> bool:
        if self._call is None:
            return False
        if not self._done:
            self._finish(self._call, ev, broken=INCOMPLETE)
        return True

    @abstractmethod
    def _finish(self, call: StartedCall, ev: ParseEvent, broken: str | None = None) -> None:
        """Send the call's last fragment (closing its arguments) and mark the block done."""


class HeaderCall(OneCall):
    """One call: a header with the name, then the arguments JSON. Text after it is ignored up to
    the block's end marker; in a format without one (``ends_at_value``) it is text again."""

    def __init__(
        self, parser: CallSink, opener: str, header: re.Pattern[str], *, ends_at_value: bool = False
    ) -> None:
        super().__init__(parser, opener)
        self._header = header
        self._ends_at_value = ends_at_value
        self._args = ArgsValue()
        self._begun = False

    def feed(self, chunk: str, ev: ParseEvent) -> tuple[int, int]:
        if self._done:
            self.raw += chunk
            return FED, len(chunk)
        start = len(self.raw)  # where chunk begins in raw
        self.raw += chunk
        pos = start
        if self._call is None:
            m = self._header.match(self.raw)
            if m is None:
                return FED, len(chunk)
            name = next(g for g in m.groups() if g)
            self._call, pos = self.parser.start_call(name.strip(), ev), m.end()
        call, status, end = self._call, FED, len(self.raw)
        for j in range(pos, len(self.raw)):
            ch = self.raw[j]
            if not self._begun and ch in WS:
                continue
            self._begun = True
            r = self._args.push(ch)
            if r != MORE:
                status = OVER if r == BAD or self._ends_at_value else FED
                end = j if r in (AFTER, BAD) else j + 1
                self._finish(call, ev, broken=MALFORMED if r == BAD else None)
                break
        else:
            self.parser.add_fragment(call, self._args.take(), ev)
        if status == OVER:  # the rest of the chunk is not this block's
            self.raw = self.raw[: max(end, start)]
            return OVER, max(end, start) - start
        return status, len(chunk)

    def _finish(self, call: StartedCall, ev: ParseEvent, broken: str | None = None) -> None:
        self.parser.add_fragment(call, self._args.take() + self._args.closing(), ev)
        self.parser.end_call(ev, broken)
        self._done = True


class _PairsCall(OneCall):
    """A call whose arguments come as key/value pairs, each adding ``"K": V`` (V as the JSON it
    spells, else a string) to one object, closed when the call ends."""

    def __init__(self, parser: CallSink, opener: str) -> None:
        super().__init__(parser, opener)
        self._pos = 0
        self._params = 0

    def _pair(self, call: StartedCall, key: str, raw: str, ev: ParseEvent) -> None:
        value = json.dumps(typed_value(raw), ensure_ascii=False)
        sep = ", " if self._params else "{"
        self.parser.add_fragment(call, f"{sep}{json.dumps(key)}: {value}", ev)
        self._params += 1

    def _finish(self, call: StartedCall, ev: ParseEvent, broken: str | None = None) -> None:
        self.parser.add_fragment(call, "}" if self._params else "{}", ev)
        self.parser.end_call(ev, broken)
        self._done = True


class XmlCall(_PairsCall):
    """qwen3coder: ``<function=NAME>`` starts the call; each complete ``<parameter=K>V</parameter>``
    adds ``"K": V`` to the arguments object, which ``</function>`` closes."""

    _FUNCTION = re.compile(r"<function=([^>\s]+)>")
    _PARAMETER = re.compile(r"<parameter=([^>\s]+)>(.*?)</parameter>", re.S)

    def feed(self, chunk: str, ev: ParseEvent) -> tuple[int, int]:
        self.raw += chunk
        if self._done:
            return FED, len(chunk)
        if self._call is None:
            m = self._FUNCTION.search(self.raw)
            if m is None:
                return FED, len(chunk)
            self._call, self._pos = self.parser.start_call(m.group(1), ev), m.end()
        call = self._call
        end = self.raw.find("</function>", self._pos)
        stop = len(self.raw) if end == -1 else end
        while p := self._PARAMETER.search(self.raw, self._pos, stop):
            self._pair(call, p.group(1), p.group(2).strip("\n"), ev)
            self._pos = p.end()
        if end != -1:
            self._finish(call, ev)
        return FED, len(chunk)


class KeyValueCall(_PairsCall):
    """glm: ``NAME`` on the block's first line, then ``<arg_key>K</arg_key><arg_value>V</arg_value>``
    pairs, each adding ``"K": V`` (V as the JSON it spells, else a string); the block's end
    marker ends the call."""

    _NAME = re.compile(r"\s*([^\s<]+)(?=\s|<)")
    _PAIR = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.S)

    def feed(self, chunk: str, ev: ParseEvent) -> tuple[int, int]:
        self.raw += chunk
        if self._call is None:
            m = self._NAME.match(self.raw)
            if m is None:
                return FED, len(chunk)
            self._call, self._pos = self.parser.start_call(m.group(1), ev), m.end()
        call = self._call
        while p := self._PAIR.search(self.raw, self._pos):
            self._pair(call, p.group(1).strip(), p.group(2), ev)
            self._pos = p.end()
        return FED, len(chunk)

    def close(self, ev: ParseEvent) -> bool:
        if self._call is None and self.marker_seen and self._NAME.match(self.raw + "\n"):
            self.feed("\n", ev)  # a call without arguments: its name is the whole block
            self.raw = self.raw[:-1]
        if self._call is not None and self.marker_seen and not self.raw[self._pos :].strip():
            self._finish(self._call, ev)
        return super().close(ev)


class _MistralBlock(Block):
    """mistral: a JSON list of calls (``[TOOL_CALLS][{...}]``), or, from tokenizer v11 on, one
    ``NAME[ARGS]{...}`` call per ``[TOOL_CALLS]``: the first character decides."""

    def __init__(self, parser: CallSink, opener: str) -> None:
        super().__init__(parser, opener)
        self._inner: Block | None = None

    def feed(self, chunk: str, ev: ParseEvent) -> tuple[int, int]:
        held = 0  # leading whitespace taken before the form was known, fed again with chunk
        if self._inner is None:
            lead = (self.raw + chunk).lstrip()
            if not lead:
                self.raw += chunk
                return FED, len(chunk)
            if lead[0] in "[{":
                self._inner = JsonCalls(self.parser, self.opener, python_tag=False)
            else:
                self._inner = HeaderCall(
                    self.parser, self.opener, HEADERS["mistral"], ends_at_value=True
                )
            held, chunk, self.raw = len(self.raw), self.raw + chunk, ""
        status, used = self._inner.feed(chunk, ev)
        self.raw, self.leftover = self._inner.raw, self._inner.leftover
        return status, max(used - held, 0)

    def close(self, ev: ParseEvent) -> bool:
        return self._inner is not None and self._inner.close(ev)


def open_block(parser: CallSink, opener: str) -> Block:
    """The block that parses what follows ``opener`` (a start marker, "" for a bare JSON call)."""
    if parser.family == "qwen3coder":
        return XmlCall(parser, opener)
    if parser.family == "glm":
        return KeyValueCall(parser, opener)
    if parser.family == "mistral":
        return _MistralBlock(parser, opener)
    if parser.family in HEADERS:
        return HeaderCall(parser, opener, HEADERS[parser.family])
    return JsonCalls(parser, opener, python_tag=opener.endswith("<|python_tag|>"))
