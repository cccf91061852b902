"""The incremental JSON scanner under the tool-call parser: one JSON value validated a character
at a time, a JSON string's body decoded as it arrives, and a call's arguments value turned into
arguments text while the model writes it.
Tested by tests/core/inference/tools/test_parser.py and tests/core/inference/test_reasoning.py."""

from __future__ import annotations

import json
import logging
import re

log = logging.getLogger(__name__)

WS = " \t\r\n"
# what JsonScanner.push says: taken; value complete; value ended before this character; bad
MORE, DONE, AFTER, BAD = range(4)
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_NUMBER_PREFIX = re.compile(r"-|-?(?:0|[1-9][0-9]*)(?:\.[0-9]*)?(?:[eE][+-]?[0-9]*)?")
_TOKEN_CHARS = frozenset("0123456789+-.abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
_LITERALS = ("true", "false", "null")
_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
_HEX = frozenset("0123456789abcdefABCDEF")


class JsonScanner:
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
                return BAD
            self._emit(self._tok)
            self._tok = ""
            if self._value_end() == DONE:
                return AFTER
        if self._expect == "done":
            return AFTER
        if ch in WS:
            if self._stack:
                (self._held or self._out).append(ch)
            return MORE
        if self._expect == "value":
            return self._value(ch)
        if self._expect == "key":
            if ch == '"':
                self._held.append(ch)
                self._in_str, self._is_key = True, True
                return MORE
            return self._close(ch) if ch == "}" and self._first else BAD
        if self._expect == "colon":
            if ch != ":":
                return BAD
            self._held.append(ch)
            self._expect = "value"
            return MORE
        if ch == ",":  # after a value in a container
            self._held.append(ch)
            self._expect = "key" if self._stack[-1] == "{" else "value"
            return MORE
        return self._close(ch) if ch == ("}" if self._stack[-1] == "{" else "]") else BAD

    def _value(self, ch: str) -> int:
        if self._object_only and not self._stack and ch != "{":
            return BAD
        if ch in "{[":
            self._emit(ch)
            self._stack.append(ch)
            self._expect, self._first = ("key" if ch == "{" else "value"), True
            return MORE
        if ch == "]" and self._first and self._stack[-1:] == ["["]:
            return self._close(ch)
        self._first = False
        if ch == '"':
            self._emit(ch)
            self._in_str, self._is_key = True, False
            return MORE
        if ch == "-" or ch.isascii() and ch.isdigit() or ch in "tfn":
            self._tok = ch
            return MORE
        return BAD

    def _token(self, ch: str) -> int:
        self._tok += ch
        if self._tok[0] in "tfn":
            if self._tok in _LITERALS:
                self._emit(self._tok)
                self._tok = ""
                return self._value_end()
            return MORE if any(w.startswith(self._tok) for w in _LITERALS) else BAD
        return MORE if _NUMBER_PREFIX.fullmatch(self._tok) else BAD

    def _string(self, ch: str) -> int:
        if self._esc:
            self._esc += ch
            if len(self._esc) == 2:
                if ch == "u":
                    return MORE
                if ch not in _ESCAPES:
                    return BAD
            elif ch not in _HEX:
                return BAD
            elif len(self._esc) < 6:
                return MORE
            piece, self._esc = self._esc, ""
            (self._held if self._is_key else self._out).append(piece)
            return MORE
        if ch == "\\":
            self._esc = ch
            return MORE
        if ch < " ":
            ch = json.dumps(ch)[1:-1]
        (self._held if self._is_key else self._out).append(ch)
        if ch != '"':
            return MORE
        self._in_str = False
        if self._is_key:
            self._expect = "colon"
            return MORE
        return self._value_end()

    def _close(self, ch: str) -> int:
        self._emit(ch)
        self._stack.pop()
        return self._value_end()

    def _value_end(self) -> int:
        self._first = False
        self._expect = "next" if self._stack else "done"
        return MORE if self._stack else DONE

    def _emit(self, text: str) -> None:
        if self._held:
            self._out.extend(self._held)
            self._held.clear()
        self._out.append(text)


class StringDecoder:
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


class ArgsValue:
    """The JSON value of a call's arguments, turned into arguments text as it arrives: an object
    streams its own text; a string streams its decoded content, checked as a JSON object; any
    other value (``null``, a list) gives ``{}``."""

    def __init__(self) -> None:
        self._json = JsonScanner(object_only=True)
        self._kind = ""
        self._str = StringDecoder()
        self._other = JsonScanner()
        self._broken = False

    def push(self, ch: str) -> int:
        if not self._kind:
            self._kind = {"{": "object", '"': "string"}.get(ch, "other")
            if self._kind == "string":
                return MORE
        if self._kind == "object":
            return self._json.push(ch)
        if self._kind == "other":
            return self._other.push(ch)
        try:
            text = self._str.push(ch)
        except ValueError:
            return BAD
        for c in text:
            if self._broken:
                break
            r = self._json.push(c)
            if r == BAD or r == AFTER and c not in WS:
                log.info("tool call arguments string is not one JSON object; keeping its start")
                self._broken = True
        return DONE if self._str.closed else MORE

    def take(self) -> str:
        return self._json.take()

    def closing(self) -> str:
        return self._json.closing()
