"""Tool calling: which format a model writes calls in, a generic prompt for models whose template
ignores tools, a grammar that forces a valid call, and a streaming parser per family.

Families (detected from the chat template, overridable per model):
- ``hermes``: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (Hermes, Qwen 2/2.5/3,
  and Hearth's generic prompt for templates without tools)
- ``llama3``: a bare JSON object ``{"name": ..., "parameters": {...}}`` or ``<|python_tag|>...``
- ``mistral``: ``[TOOL_CALLS][{"name": ..., "arguments": {...}}]``
- ``qwen3coder``: ``<tool_call><function=NAME><parameter=K>V</parameter></function></tool_call>``
- ``harmony`` (gpt-oss): ``<|channel|>commentary to=functions.NAME ... <|message|>{...}<|call|>``
- ``deepseek``: ``<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\\n```json\\n{...}\\n```<｜tool▁call▁end｜>``
"""

from __future__ import annotations

import json
import logging
import re
import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from app.core import jsonsafe

log = logging.getLogger(__name__)

FAMILIES = ("hermes", "llama3", "mistral", "qwen3coder", "harmony", "deepseek")

GENERIC_TOOL_PROMPT = (
    "You can call functions. The available functions, as JSON schemas:\n{tools}\n\n"
    "To call a function, answer with one block per call, exactly:\n"
    '<tool_call>\n{{"name": "<function name>", "arguments": {{<arguments as JSON>}}}}\n</tool_call>\n'
    "Call a function only when it helps; otherwise answer normally."
)


@dataclass(frozen=True, slots=True)
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]

    def as_openai(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }


def detect_family(template: str | None) -> str:
    """The tool-call format a chat template teaches its model (hermes when unsure)."""
    t = template or ""
    if "<function=" in t and "<parameter=" in t:
        return "qwen3coder"
    if "<tool_call>" in t:
        return "hermes"
    if "[TOOL_CALLS]" in t:
        return "mistral"
    if "<|python_tag|>" in t or ("ipython" in t and "<|eot_id|>" in t):
        return "llama3"
    if "<|channel|>" in t or "<|call|>" in t:
        return "harmony"
    if "tool▁call▁begin" in t or "tool▁calls▁begin" in t:
        return "deepseek"
    return "hermes"


def template_handles_tools(template: str | None) -> bool:
    return bool(template) and "tools" in (template or "")


def generic_tool_prompt(tools: list[Tool]) -> str:
    return GENERIC_TOOL_PROMPT.format(tools="\n".join(json.dumps(t.as_openai()) for t in tools))


def tool_call_constraint(tools: list[Tool], *, parallel: bool) -> tuple[str, str]:
    """A constraint that forces hermes-style calls: the call object's JSON schema (one
    alternative per tool, arguments by that tool's own schema) for the runtime to compile."""
    alternatives = []
    for i, t in enumerate(tools):
        params = t.parameters or {}
        if not params.get("properties") and params.get("type", "object") == "object":
            params = {"type": "object", "properties": {}, "additionalProperties": False}
        # a tool's local $refs point into its own schema, which now sits inside the call object
        here = "#/properties/arguments" if len(tools) == 1 else f"#/oneOf/{i}/properties/arguments"
        params = _rebase_refs(params, here)
        alternatives.append(
            {
                "type": "object",
                "properties": {"name": {"const": t.name}, "arguments": params},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
        )
    schema = alternatives[0] if len(alternatives) == 1 else {"oneOf": alternatives}
    return ("tool_call", json.dumps({"schema": schema, "parallel": parallel}))


def _rebase_refs(schema: dict[str, Any], base: str) -> dict[str, Any]:
    """A copy of ``schema`` whose local ``$ref`` pointers (``#...``) start at ``base``."""
    out: dict[str, Any] = json.loads(json.dumps(schema))
    stack: list[Any] = [out]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#"):
                node["$ref"] = base + ref[1:]
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return out


@dataclass
class ToolCall:
    index: int
    id: str
    name: str
    arguments: str = ""


@dataclass
class ParseEvent:
    """What the parser found in a piece of streamed text."""

    text: str = ""
    started: list[ToolCall] = field(default_factory=list)  # new calls: id/name, no arguments yet
    arguments: list[tuple[int, str]] = field(default_factory=list)  # (index, fragment)


def _new_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


# (start marker, end marker) of one call block, per family
_BLOCKS = {
    "hermes": ("<tool_call>", "</tool_call>"),
    "qwen3coder": ("<tool_call>", "</tool_call>"),
    "mistral": ("[TOOL_CALLS]", None),
    "llama3": ("<|python_tag|>", None),
    "harmony": ("<|channel|>commentary to=functions.", "<|call|>"),
    "deepseek": ("<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>"),
}

# what a block reports back after a piece of its text
_FED = 0  # taken in; more may come
_NOT_A_CALL = 1  # malformed before any call started: give the block back as text
_OVER = 2  # malformed (or done, for formats without an end marker) after a call started
_WHOLE = 3  # (inside _JsonCalls) not JSON: parse the block whole when it ends
_NOT_A_CALL_INCL = 4  # (inside _JsonCalls) _NOT_A_CALL, this character included


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
    """

    def __init__(self, family: str) -> None:
        self.family = family if family in FAMILIES else "hermes"
        self.start, self.end = _BLOCKS[self.family]
        self._buf = ""
        self._block: _Block | None = None
        self.calls: list[ToolCall] = []
        self._answer_started = False

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
            out = buf[: len(buf) - hold]
            if self.family == "llama3" and not self._answer_started and not out.strip():
                if not final:
                    return False  # wait: a bare JSON call may follow the whitespace
            self._say(out, ev)
            self._buf = buf[len(buf) - hold :]
            return False
        self._say(buf[:i], ev)
        self._open(self.start, buf[i + len(self.start) :])
        return True

    def _in_block(self, block: _Block, ev: ParseEvent, final: bool) -> bool:
        """Feed the open block what can be judged now; True when it ended."""
        buf, marker = self._buf, ""  # marker: the end marker, once seen
        if self.end is None:
            chunk, rest = buf, ""
        elif (j := buf.find(self.end)) != -1:
            chunk, rest, marker = buf[:j], buf[j + len(self.end) :], self.end
        else:
            hold = 0 if final else _partial(buf, self.end)
            chunk, rest = buf[: len(buf) - hold], buf[len(buf) - hold :]
        status, used = block.feed(chunk, ev) if chunk else (_FED, 0)
        if status == _NOT_A_CALL:
            self._block = None
            self._say(block.opener + block.raw, ev)
            self._buf = chunk[used:] + marker + rest
            return True
        if status == _OVER:
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
        if not block.close(ev):
            self._say(block.opener + block.raw + marker, ev)
        return True

    def _open(self, opener: str, rest: str) -> None:
        self._buf = rest
        if self.family == "qwen3coder":
            self._block = _XmlCall(self, opener)
        elif self.family in ("harmony", "deepseek"):
            self._block = _HeaderCall(self, opener, _HEADERS[self.family])
        else:
            self._block = _JsonCalls(self, opener, python_tag=opener == "<|python_tag|>")

    def _say(self, text: str, ev: ParseEvent) -> None:
        ev.text += text
        self._answer_started = self._answer_started or bool(text.strip())

    def _start(self, name: str, ev: ParseEvent) -> ToolCall:
        call = ToolCall(len(self.calls), _new_id(), name)
        self.calls.append(call)
        ev.started.append(ToolCall(call.index, call.id, call.name))
        return call

    @staticmethod
    def _fragment(call: ToolCall, text: str, ev: ParseEvent) -> None:
        if not text:
            return
        call.arguments += text
        if ev.arguments and ev.arguments[-1][0] == call.index:
            ev.arguments[-1] = (call.index, ev.arguments[-1][1] + text)
        else:
            ev.arguments.append((call.index, text))


def _partial(buf: str, marker: str) -> int:
    for k in range(min(len(marker) - 1, len(buf)), 0, -1):
        if buf.endswith(marker[:k]):
            return k
    return 0


# --- incremental JSON -------------------------------------------------------------------------

_WS = " \t\r\n"
_MORE, _DONE, _AFTER, _BAD = range(4)  # _Json.push: taken; value complete; value ended before; bad
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_NUMBER_PREFIX = re.compile(r"-|-?(?:0|[1-9][0-9]*)(?:\.[0-9]*)?(?:[eE][+-]?[0-9]*)?")
_TOKEN_CHARS = frozenset("0123456789+-.abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
_LITERALS = ("true", "false", "null")
_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
_HEX = frozenset("0123456789abcdefABCDEF")


class _Json:
    """One JSON value, scanned and validated a character at a time.

    ``take()`` releases accepted text only up to points that ``closing()`` can still complete into
    a valid value: a key with its colon, a comma and a number or literal are held until what
    follows shows they are sound, an escape sequence until it is whole. Raw control characters in
    strings (which strict JSON forbids and models write) are escaped on the way through.
    """

    def __init__(self, *, object_only: bool = False) -> None:
        self._object_only = object_only
        self._stack: list[str] = []  # open containers, "{" or "["
        self._expect = "value"  # value | key | colon | next | done
        self._first = False  # just inside a container: it may close at once
        self._in_str = False
        self._is_key = False
        self._esc = ""
        self._tok = ""  # number or literal so far
        self._held: list[str] = []
        self._out: list[str] = []

    @property
    def done(self) -> bool:
        return self._expect == "done"

    def take(self) -> str:
        text = "".join(self._out)
        self._out.clear()
        return text

    def closing(self) -> str:
        """What completes the text taken so far into a valid value."""
        if self.done:
            return ""
        quote = '"' if self._in_str and not self._is_key else ""
        if not (self._stack or quote):
            return "{}" if self._object_only else "null"
        # a number cut short is whole if it parses: the stream has ended
        last = "".join(self._held) + self._tok if _NUMBER.fullmatch(self._tok) else ""
        return last + quote + "".join("}" if c == "{" else "]" for c in reversed(self._stack))

    def push(self, ch: str) -> int:
        if self._in_str:
            return self._string(ch)
        if self._tok:
            if ch in _TOKEN_CHARS:
                return self._token(ch)
            if not _NUMBER.fullmatch(self._tok):
                return _BAD
            self._emit(self._tok)
            self._tok = ""
            if self._value_end() == _DONE:
                return _AFTER
        if self._expect == "done":
            return _AFTER
        if ch in _WS:
            if self._stack:
                (self._held or self._out).append(ch)
            return _MORE
        if self._expect == "value":
            return self._value(ch)
        if self._expect == "key":
            if ch == '"':
                self._held.append(ch)
                self._in_str, self._is_key = True, True
                return _MORE
            return self._close(ch) if ch == "}" and self._first else _BAD
        if self._expect == "colon":
            if ch != ":":
                return _BAD
            self._held.append(ch)
            self._expect = "value"
            return _MORE
        if ch == ",":  # after a value in a container
            self._held.append(ch)
            self._expect = "key" if self._stack[-1] == "{" else "value"
            return _MORE
        return self._close(ch) if ch == ("}" if self._stack[-1] == "{" else "]") else _BAD

    def _value(self, ch: str) -> int:
        if self._object_only and not self._stack and ch != "{":
            return _BAD
        if ch in "{[":
            self._emit(ch)
            self._stack.append(ch)
            self._expect, self._first = ("key" if ch == "{" else "value"), True
            return _MORE
        if ch == "]" and self._first and self._stack[-1:] == ["["]:
            return self._close(ch)
        self._first = False
        if ch == '"':
            self._emit(ch)
            self._in_str, self._is_key = True, False
            return _MORE
        if ch == "-" or ch.isascii() and ch.isdigit() or ch in "tfn":
            self._tok = ch
            return _MORE
        return _BAD

    def _token(self, ch: str) -> int:
        self._tok += ch
        if self._tok[0] in "tfn":
            if self._tok in _LITERALS:
                self._emit(self._tok)
                self._tok = ""
                return self._value_end()
            return _MORE if any(w.startswith(self._tok) for w in _LITERALS) else _BAD
        return _MORE if _NUMBER_PREFIX.fullmatch(self._tok) else _BAD

    def _string(self, ch: str) -> int:
        if self._esc:
            self._esc += ch
            if len(self._esc) == 2:
                if ch == "u":
                    return _MORE
                if ch not in _ESCAPES:
                    return _BAD
            elif ch not in _HEX:
                return _BAD
            elif len(self._esc) < 6:
                return _MORE
            piece, self._esc = self._esc, ""
            (self._held if self._is_key else self._out).append(piece)
            return _MORE
        if ch == "\\":
            self._esc = ch
            return _MORE
        if ch < " ":
            ch = json.dumps(ch)[1:-1]
        (self._held if self._is_key else self._out).append(ch)
        if ch != '"':
            return _MORE
        self._in_str = False
        if self._is_key:
            self._expect = "colon"
            return _MORE
        return self._value_end()

    def _close(self, ch: str) -> int:
        self._emit(ch)
        self._stack.pop()
        return self._value_end()

    def _value_end(self) -> int:
        self._first = False
        self._expect = "next" if self._stack else "done"
        return _MORE if self._stack else _DONE

    def _emit(self, text: str) -> None:
        if self._held:
            self._out.extend(self._held)
            self._held.clear()
        self._out.append(text)


class _StringDecoder:
    """The body of a JSON string (after its opening quote), decoded as it arrives.

    Raises:
        ValueError: on a bad escape sequence.
    """

    def __init__(self) -> None:
        self.closed = False
        self._esc = ""
        self._high = 0  # a high surrogate waiting for its pair

    def push(self, ch: str) -> str:
        if self._esc:
            self._esc += ch
            if len(self._esc) == 2 and ch != "u":
                if ch not in _ESCAPES:
                    raise ValueError(f"bad escape \\{ch}")
                self._esc = ""
                return self._char(_ESCAPES[ch])
            if len(self._esc) > 2 and ch not in _HEX:
                raise ValueError("bad \\u escape")
            if len(self._esc) < 6:
                return ""
            code, self._esc = int(self._esc[2:], 16), ""
            if 0xD800 <= code < 0xDC00:
                out = self._char("")
                self._high = code
                return out
            if 0xDC00 <= code < 0xE000:
                high, self._high = self._high, 0
                return (
                    chr(0x10000 + ((high - 0xD800) << 10) + (code - 0xDC00)) if high else "\ufffd"
                )
            return self._char(chr(code))
        if ch == "\\":
            self._esc = ch
            return ""
        if ch == '"':
            self.closed = True
            return self._char("")
        return self._char(ch)

    def _char(self, text: str) -> str:
        if self._high:  # a lone surrogate cannot be sent as UTF-8
            self._high = 0
            return "\ufffd" + text
        return text


class _ArgsValue:
    """The JSON value of a call's arguments, turned into arguments text as it arrives: an object
    streams its own text; a string streams its decoded content, checked as a JSON object; any
    other value (``null``, a list) gives ``{}``."""

    def __init__(self) -> None:
        self._json = _Json(object_only=True)
        self._kind = ""
        self._str = _StringDecoder()
        self._other = _Json()
        self._broken = False

    def push(self, ch: str) -> int:
        if not self._kind:
            self._kind = {"{": "object", '"': "string"}.get(ch, "other")
            if self._kind == "string":
                return _MORE
        if self._kind == "object":
            return self._json.push(ch)
        if self._kind == "other":
            return self._other.push(ch)
        try:
            text = self._str.push(ch)
        except ValueError:
            return _BAD
        for c in text:
            if self._broken:
                break
            r = self._json.push(c)
            if r == _BAD or r == _AFTER and c not in _WS:
                log.info("tool call arguments string is not one JSON object; keeping its start")
                self._broken = True
        return _DONE if self._str.closed else _MORE

    def take(self) -> str:
        return self._json.take()

    def closing(self) -> str:
        return self._json.closing()


# --- blocks -----------------------------------------------------------------------------------


class _Block(ABC):
    """One call block's text after its start marker, turned into calls as it arrives."""

    def __init__(self, parser: ToolCallParser, opener: str) -> None:
        self.parser = parser
        self.opener = opener  # the marker that opened the block ("" for a bare JSON call)
        self.raw = ""  # the block's text taken so far: given back as text when it is no call
        self.leftover = ""  # taken text that goes back to the stream when the block is _OVER

    @abstractmethod
    def feed(self, chunk: str, ev: ParseEvent) -> tuple[int, int]:
        """Take ``chunk`` in: (_FED | _NOT_A_CALL | _OVER, characters of it used)."""

    @abstractmethod
    def close(self, ev: ParseEvent) -> bool:
        """The block ended: finish an open call. False when the block holds no call at all."""


class _JsonCalls(_Block):
    """hermes, mistral and llama3: call objects ``{"name": ..., "arguments" | "parameters": ...}``,
    one or several, bare, in a list, or separated by ``;`` and ``,``."""

    def __init__(self, parser: ToolCallParser, opener: str, *, python_tag: bool) -> None:
        super().__init__(parser, opener)
        self._python_tag = python_tag  # <|python_tag|>name.call(k="v") is parsed whole at the end
        self._whole = False
        self._stopped = False
        self._mode = "top"
        self._in_list = False
        self._calls = 0  # calls started in this block
        self._new_object()

    def _new_object(self) -> None:
        self._call: ToolCall | None = None
        self._first = True
        self._key = ""
        self._str = _StringDecoder()
        self._parts: list[str] = []
        self._args = _ArgsValue()  # fresh: no arguments member, closing() gives {}
        self._args_seen = False
        self._early: list[str] = []  # arguments text seen before the name
        self._skip = _Json()

    def feed(self, chunk: str, ev: ParseEvent) -> tuple[int, int]:
        if self._stopped or self._whole:
            self.raw += chunk
            return _FED, len(chunk)
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
                return _FED, len(chunk)
            used = i + 1 if status == _NOT_A_CALL_INCL else i
            self.raw += chunk[:used]
            if status == _OVER:
                self._stopped = True
                return _OVER, used
            return _NOT_A_CALL, used
        self.raw += chunk
        self._drain(ev)
        return _FED, len(chunk)

    def close(self, ev: ParseEvent) -> bool:
        if self._whole:
            try:
                parsed = parse_block("llama3", self.raw)
            except ValueError:
                return False
            for name, args in parsed:
                self.parser._fragment(self.parser._start(name, ev), args, ev)
            return True
        if self._call is not None:
            self._finish(self._call, ev)
        return self._calls > 0

    def _step(self, ch: str, ev: ParseEvent) -> int | None:
        mode = self._mode
        if mode in ("key", "name"):
            text = self._str.push(ch)
            self._parts.append(text)
            if self._str.closed:
                value, self._parts, self._str = "".join(self._parts), [], _StringDecoder()
                if mode == "key":
                    self._key, self._mode = value, "colon"
                else:
                    self._begin(value, ev)
            return None
        if mode == "args":
            r = self._args.push(ch)
            if r == _BAD:
                return self._bad(ev)
            if r != _MORE:
                self._mode = "after"
            return self._step(ch, ev) if r == _AFTER else None
        if mode == "skip":
            r = self._skip.push(ch)
            if r == _BAD:
                return self._bad(ev)
            if r != _MORE:
                self._mode = "after"
            return self._step(ch, ev) if r == _AFTER else None
        if mode == "top":
            return self._top(ch)
        if ch in _WS:
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
        if ch in ";," or ch in _WS:
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
        return _OVER if self._calls else _NOT_A_CALL

    def _value(self, ch: str, ev: ParseEvent) -> int | None:
        if self._key == "name" and self._call is None:
            if ch != '"':
                return self._bad(ev)
            self._mode = "name"
            return None
        if self._key in ("arguments", "parameters") and not self._args_seen:
            self._args_seen, self._mode = True, "args"
        else:  # another member, or a second arguments member: skipped
            self._skip, self._mode = _Json(), "skip"
        return self._step(ch, ev)

    def _begin(self, name: str, ev: ParseEvent) -> None:
        self._drain(ev)
        self._call = self.parser._start(name, ev)
        self._calls += 1
        self.parser._fragment(self._call, "".join(self._early), ev)
        self._early.clear()
        self._mode = "after"

    def _drain(self, ev: ParseEvent) -> None:
        text = self._args.take()
        if self._call is not None:
            self.parser._fragment(self._call, text, ev)
        elif text:
            self._early.append(text)

    def _finish(self, call: ToolCall, ev: ParseEvent) -> None:
        self._drain(ev)
        self.parser._fragment(call, self._args.closing(), ev)
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
            self._finish(self._call, ev)
        return _OVER if self._calls else _NOT_A_CALL


# harmony and deepseek: the header that names the call, then the arguments as JSON
_HEADERS = {
    "harmony": re.compile(r"\s*([\w.-]+)\s*(?:<\|constrain\|>\s*json)?\s*<\|message\|>"),
    "deepseek": re.compile(r"\s*(?:function)?<｜tool▁sep｜>([^\n]+)\n```(?:json)?\n"),
}


class _OneCall(_Block):
    """A block that holds at most one call, ended by ``_finish`` (once)."""

    def __init__(self, parser: ToolCallParser, opener: str) -> None:
        super().__init__(parser, opener)
        self._call: ToolCall | None = None
        self._done = False

    def close(self, ev: ParseEvent) -> bool:
        if self._call is None:
            return False
        if not self._done:
            self._finish(self._call, ev)
        return True

    @abstractmethod
    def _finish(self, call: ToolCall, ev: ParseEvent) -> None:
        """Send the call's last fragment (closing its arguments) and mark the block done."""


class _HeaderCall(_OneCall):
    """One call: a header with the name, then the arguments JSON; text after it is ignored."""

    def __init__(self, parser: ToolCallParser, opener: str, header: re.Pattern[str]) -> None:
        super().__init__(parser, opener)
        self._header = header
        self._args = _ArgsValue()
        self._begun = False

    def feed(self, chunk: str, ev: ParseEvent) -> tuple[int, int]:
        self.raw += chunk
        if self._done:
            return _FED, len(chunk)
        body = chunk
        if self._call is None:
            m = self._header.match(self.raw)
            if m is None:
                return _FED, len(chunk)
            self._call = self.parser._start(m.group(1).strip(), ev)
            body = self.raw[m.end() :]
        call, status = self._call, _FED
        for ch in body:
            if not self._begun and ch in _WS:
                continue
            self._begun = True
            r = self._args.push(ch)
            if r != _MORE:
                status = _OVER if r == _BAD else _FED
                self._finish(call, ev)
                break
        else:
            self.parser._fragment(call, self._args.take(), ev)
        return status, len(chunk)

    def _finish(self, call: ToolCall, ev: ParseEvent) -> None:
        self.parser._fragment(call, self._args.take() + self._args.closing(), ev)
        self._done = True


class _XmlCall(_OneCall):
    """qwen3coder: ``<function=NAME>`` starts the call; each complete ``<parameter=K>V</parameter>``
    adds ``"K": V`` to the arguments object, which ``</function>`` closes."""

    _FUNCTION = re.compile(r"<function=([^>\s]+)>")
    _PARAMETER = re.compile(r"<parameter=([^>\s]+)>(.*?)</parameter>", re.S)

    def __init__(self, parser: ToolCallParser, opener: str) -> None:
        super().__init__(parser, opener)
        self._pos = 0
        self._params = 0

    def feed(self, chunk: str, ev: ParseEvent) -> tuple[int, int]:
        self.raw += chunk
        if self._done:
            return _FED, len(chunk)
        if self._call is None:
            m = self._FUNCTION.search(self.raw)
            if m is None:
                return _FED, len(chunk)
            self._call, self._pos = self.parser._start(m.group(1), ev), m.end()
        call = self._call
        end = self.raw.find("</function>", self._pos)
        stop = len(self.raw) if end == -1 else end
        while p := self._PARAMETER.search(self.raw, self._pos, stop):
            value = json.dumps(_typed(p.group(2).strip("\n")), ensure_ascii=False)
            sep = ", " if self._params else "{"
            self.parser._fragment(call, f"{sep}{json.dumps(p.group(1))}: {value}", ev)
            self._params += 1
            self._pos = p.end()
        if end != -1:
            self._finish(call, ev)
        return _FED, len(chunk)

    def _finish(self, call: ToolCall, ev: ParseEvent) -> None:
        self.parser._fragment(call, "}" if self._params else "{}", ev)
        self._done = True


def _typed(v: str) -> Any:
    try:
        return jsonsafe.loads(v)
    except ValueError:
        return v


def _args(v: Any) -> str:
    return v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)


def _json_calls(obj: Any) -> list[tuple[str, str]]:
    items = obj if isinstance(obj, list) else [obj]
    out = []
    for it in items:
        if not isinstance(it, dict) or not isinstance(it.get("name"), str):
            raise ValueError("not a call")
        args = it.get("arguments", it.get("parameters", {}))
        out.append((it["name"], _args(args)))
    return out


def parse_block(family: str, block: str) -> list[tuple[str, str]]:
    """(name, arguments JSON) for each call in one block of ``family``'s format."""
    b = block.strip()
    if family in ("hermes", "mistral", "llama3"):
        if family == "llama3" and not b.startswith(("{", "[")):
            # <|python_tag|>name.call(key="value") is the built-in tool form; keep JSON only
            m = re.fullmatch(r"([\w.]+)\((.*)\)", b, re.S)
            if not m:
                raise ValueError("unrecognized llama3 call")
            kwargs = dict(re.findall(r'(\w+)\s*=\s*"([^"]*)"', m.group(2)))
            return [(m.group(1), json.dumps(kwargs))]
        calls: list[tuple[str, str]] = []
        pos = 0
        while pos < len(b):  # several objects may follow each other (llama3 parallel calls)
            obj, end = jsonsafe.raw_decode(b, pos)
            calls.extend(_json_calls(obj))
            pos = end
            while pos < len(b) and b[pos] in " \n\t;,":
                pos += 1
        return calls
    if family == "qwen3coder":
        m = re.search(r"<function=([^>\s]+)>(.*?)</function>", b, re.S)
        if not m:
            raise ValueError("no function")
        params = {}
        for k, v in re.findall(r"<parameter=([^>\s]+)>(.*?)</parameter>", m.group(2), re.S):
            params[k] = _typed(v.strip("\n"))
        return [(m.group(1), json.dumps(params, ensure_ascii=False))]
    if family == "harmony":
        m = re.match(r"([\w.-]+)\s*(?:<\|constrain\|>\s*json)?\s*<\|message\|>(.*)", b, re.S)
        if not m:
            raise ValueError("no harmony call")
        return [(m.group(1), _args(jsonsafe.loads(m.group(2))))]
    if family == "deepseek":
        m = re.match(r"(?:function)?<｜tool▁sep｜>([^\n]+)\n```(?:json)?\n(.*?)\n```", b, re.S)
        if not m:
            raise ValueError("no deepseek call")
        return [(m.group(1).strip(), _args(jsonsafe.loads(m.group(2))))]
    raise ValueError(f"unknown family {family}")
