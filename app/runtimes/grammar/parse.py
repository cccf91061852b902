"""GBNF, parsed the way llama.cpp parses it (iteratively: no recursion here), with the bounds
and range helpers that :mod:`app.runtimes.grammar.gbnf` and :mod:`app.runtimes.grammar.stacks` share.
Tested by tests/runtimes/grammar/test_gbnf.py and tests/runtimes/grammar/test_limits.py."""

from __future__ import annotations

import re
from dataclasses import dataclass

from app.core.inference.constraints import MAX_REPEAT

MAX_GRAMMAR_BYTES = 256 * 1024
# Group nesting and leading-reference chains. A schema within the bounds of
# app/core/inference/constraints.py nests about 1,050 at most (maxLength 1000 is 1,000 nested groups); the
# threads that compile and run grammars have THREAD_STACK_BYTES (16 MiB) of stack, which at 450
# bytes a level holds about 37,000 levels.
MAX_GRAMMAR_DEPTH = 1500
MAX_GRAMMAR_ELEMENTS = 1 << 20  # after llama.cpp expands x{m,n} (8 bytes each)
MAX_GRAMMAR_FANOUT = 512  # grammar stacks open at one position (about 0.25 s a token at 512)

_WORD = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-")
_HEX = frozenset("0123456789abcdefABCDEF")
# fast paths for well-formed text; anything they do not match is read character by character
_WORD_RE = re.compile(r"[a-zA-Z0-9-]+")
_SPACE_RE = re.compile(r"(?:[ \t]|#[^\r\n]*)*")
_SPACE_NL_RE = re.compile(r"(?:[ \t\r\n]|#[^\r\n]*)*")
_ESC = r"\\(?:[trn\\\"\[\]-]|x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8})"
_ESC_RE = re.compile(_ESC)
_TOKEN_RE = re.compile(
    r"(?P<sp>(?:[ \t]|#[^\r\n]*)+)|(?P<nl>[\r\n])|(?P<word>[a-zA-Z0-9-]+)"
    rf'|(?P<lit>"(?:[^"\\]|{_ESC})*")|(?P<cls>\[\^?(?:[^\]\\]|{_ESC})*\])'
    r"|(?P<open>\()|(?P<close>\))|(?P<alt>\|)|(?P<dot>\.)|(?P<rep>[*+?{])"
)
_SIMPLE_ESCAPES = frozenset('trn\\"[]-')
_HEX_ESCAPES = {"x": 2, "u": 4, "U": 8}
TERM, EPS, REF = 0, 1, 2
UNBOUNDED = -1


class GrammarError(ValueError):
    """The grammar is malformed, or crosses a bound (``bound`` names it)."""

    def __init__(self, message: str, bound: str | None = None) -> None:
        super().__init__(message)
        self.bound = bound


@dataclass(frozen=True, slots=True)
class GrammarShape:
    """What a grammar costs llama.cpp."""

    nesting: int  # deepest group nesting: the parser's recursion
    chain: int  # longest chain of rules referenced at the start of a rule
    elements: int  # grammar elements once repetitions are expanded
    fanout: int  # most grammar stacks open at one position (an upper bound)


# Character sets as sorted, merged (first, last) code point ranges.
Ranges = tuple[tuple[int, int], ...]
_ALL: Ranges = ((0, 0x10FFFF),)
# An item of a sequence: (kind, target or element count, min repeats, max repeats or -1, what a
# terminal matches: a literal's text, or a class's ranges; None for rule references).
Item = tuple[int, int, int, int, "str | Ranges | None"]


@dataclass
class Grammar:
    alts: list[list[list[Item]]]  # per nonterminal (rules, then groups): its alternatives
    root: int
    nesting: int
    elements: int


def parse(text: str) -> Grammar:
    """Parse ``text`` (GBNF, llama.cpp's dialect) into its rules and groups.

    Raises:
        GrammarError: malformed, or over a bound (parsing stops there).
    """
    return _Parser(text).parse()


class _Parser:
    """llama.cpp's grammar syntax: rules ``name ::= alternatives``, literals, classes, groups,
    ``* + ? {m} {m,} {m,n}``; groups become nonterminals as llama.cpp makes them sub-rules."""

    def __init__(self, text: str) -> None:
        self.s = text
        self.i = 0
        self.names: dict[str, int] = {}
        self.defined: set[int] = set()
        self.alts: list[list[list[Item]]] = []
        self.nesting = 0
        self.elements = 0
        self.quantified = False  # the last item has its repetition already

    def fail(self, why: str) -> GrammarError:
        return GrammarError(f"{why} at offset {self.i}")

    def parse(self) -> Grammar:
        self.space(newlines=True)
        while self.i < len(self.s):
            name = self.word()
            if not name:
                raise self.fail("expecting a rule name")
            self.space(newlines=False)
            if not self.s.startswith("::=", self.i):
                raise self.fail("expecting '::='")
            self.i += 3
            n = self.nonterminal(name)
            if n in self.defined:
                self.alts[n] = []  # llama.cpp keeps the last definition
            self.defined.add(n)
            self.body(n)
            self.space(newlines=True)
        undefined = [k for k, v in self.names.items() if v not in self.defined]
        if undefined:
            raise GrammarError(f"undefined rule '{undefined[0]}'")
        if "root" not in self.names:
            raise GrammarError("the grammar has no root rule")
        return Grammar(self.alts, self.names["root"], self.nesting, self.elements)

    def nonterminal(self, name: str | None = None) -> int:
        if name is not None and name in self.names:
            return self.names[name]
        self.alts.append([])
        n = len(self.alts) - 1
        if name is not None:
            self.names[name] = n
        return n

    def space(self, *, newlines: bool) -> None:
        m = (_SPACE_NL_RE if newlines else _SPACE_RE).match(self.s, self.i)
        self.i = m.end() if m else self.i

    def word(self) -> str:
        m = _WORD_RE.match(self.s, self.i)
        if m is None:
            return ""
        self.i = m.end()
        return m.group()

    def body(self, rule: int) -> None:
        """One rule's alternatives, token by token, groups on an explicit stack."""
        frames: list[tuple[int, list[list[Item]]]] = [(rule, [[]])]
        s, n, match = self.s, len(self.s), _TOKEN_RE.match
        i = self.i
        newline_ok = True  # after '::=' and '|', and anywhere inside a group
        while True:
            m = match(s, i)
            if m is None:
                self.i = i
                if i < n:
                    self.bad_token()
                if len(frames) > 1:
                    raise self.fail("expecting ')'")
                break
            kind, j = m.lastgroup, m.end()
            if kind == "sp":
                i = j
                continue
            if kind == "nl":
                if not newline_ok and len(frames) == 1:
                    break  # the end of the rule
                i = j
                continue
            newline_ok = False
            owner, alts = frames[-1]
            seq = alts[-1]
            if kind != "rep":
                self.quantified = False
            if kind == "word":
                seq.append((REF, self.nonterminal(m.group()), 1, 1, None))
            elif kind == "lit":
                text = _decode(s[m.start() + 1 : j - 1])
                seq.append((TERM, len(text), 1, 1, text) if text else (EPS, 0, 1, 1, None))
            elif kind == "cls":
                ranges = _class_ranges(s[m.start() + 1 : j - 1])
                seq.append((TERM, 1 + len(ranges), 1, 1, ranges))
            elif kind == "dot":
                seq.append((TERM, 1, 1, 1, _ALL))
            elif kind == "alt":
                alts.append([])
                newline_ok = True
            elif kind == "open":
                frames.append((self.nonterminal(), [[]]))
                if len(frames) - 1 > self.nesting:
                    self.nesting = len(frames) - 1
                    if self.nesting > MAX_GRAMMAR_DEPTH:
                        raise GrammarError(
                            f"nests groups deeper than {MAX_GRAMMAR_DEPTH} levels", "depth"
                        )
            elif kind == "close":
                if len(frames) == 1:
                    self.i = i
                    raise self.fail("unexpected ')'")
                frames.pop()
                self.alts[owner] = alts
                self.elements += sum(len(a) + 1 for a in alts)
                frames[-1][1][-1].append((REF, owner, 1, 1, None))
            else:  # a repetition: * + ? or {m,n}
                self.i = m.start()
                self.repetition(seq, m.group())
                j = self.i
            i = j
        self.i = i
        self.alts[rule] = frames[0][1]
        self.elements += sum(len(a) + 1 for a in frames[0][1])

    def bad_token(self) -> None:
        """Raise the error for the text at ``self.i`` that no token matches."""
        c = self.s[self.i]
        if c == '"':
            self.literal()  # raises: a bad escape, or no closing quote
        elif c == "[":
            self.char_class()
        raise self.fail(f"unexpected {c!r}")

    def repetition(self, seq: list[Item], c: str) -> None:
        if not seq:
            raise self.fail(f"expecting an item before {c!r}")
        self.i += 1
        if c == "*":
            lo, hi = 0, UNBOUNDED
        elif c == "+":
            lo, hi = 1, UNBOUNDED
        elif c == "?":
            lo, hi = 0, 1
        else:
            lo, hi = self.braces()
        kind, target, _, _, info = seq[-1]
        if self.quantified:
            raise self.fail(f"expecting an item before {c!r}")  # llama.cpp refuses "a**" too
        self.quantified = True
        size = target if kind == TERM else 1
        # llama.cpp copies the item `lo` times and adds one optional rule per further repeat
        extra = 1 if hi == UNBOUNDED else hi - lo
        self.elements += size * max(lo - 1, 0) + extra * (size + 3)
        if self.elements > MAX_GRAMMAR_ELEMENTS:
            raise GrammarError(f"expands to more than {MAX_GRAMMAR_ELEMENTS} elements", "elements")
        seq[-1] = (kind, target, lo, hi, info)

    def braces(self) -> tuple[int, int]:
        self.space(newlines=False)
        lo = self.integer()
        self.space(newlines=False)
        hi = lo
        if self.i < len(self.s) and self.s[self.i] == ",":
            self.i += 1
            self.space(newlines=False)
            hi = self.integer() if self.i < len(self.s) and self.s[self.i].isdigit() else -1
            self.space(newlines=False)
        if self.i >= len(self.s) or self.s[self.i] != "}":
            raise self.fail("expecting '}'")
        self.i += 1
        if lo > MAX_REPEAT or hi > MAX_REPEAT:
            raise GrammarError(
                f"repeats an item {max(lo, hi)} times; at most {MAX_REPEAT} are allowed", "repeat"
            )
        if hi != UNBOUNDED and hi < lo:
            raise self.fail("a repetition with its bounds out of order")
        return lo, hi

    def integer(self) -> int:
        start = self.i
        while self.i < len(self.s) and self.s[self.i].isdigit():
            self.i += 1
        if start == self.i:
            raise self.fail("expecting an integer")
        if self.i - start > 9:
            raise GrammarError(
                f"repeats an item more than {MAX_REPEAT} times; at most {MAX_REPEAT} are allowed",
                "repeat",
            )
        return int(self.s[start : self.i])

    def char(self) -> None:
        s = self.s
        if s[self.i] != "\\":
            self.i += 1
            return
        e = s[self.i + 1] if self.i + 1 < len(s) else ""
        if e in _SIMPLE_ESCAPES:
            self.i += 2
            return
        width = _HEX_ESCAPES.get(e)
        if width is None:
            raise self.fail(f"unknown escape '\\{e}'")
        digits = s[self.i + 2 : self.i + 2 + width]
        if len(digits) != width or not all(d in _HEX for d in digits):
            raise self.fail(f"'\\{e}' needs {width} hex digits")
        self.i += 2 + width

    def literal(self) -> int:
        """A "..." literal; returns its length in characters (one element each)."""
        self.i += 1
        n = 0
        while self.i < len(self.s) and self.s[self.i] != '"':
            self.char()
            n += 1
        if self.i >= len(self.s):
            raise self.fail("unterminated literal")
        self.i += 1
        return n

    def char_class(self) -> int:
        """A [...] class; returns its element count."""
        self.i += 1
        if self.i < len(self.s) and self.s[self.i] == "^":
            self.i += 1
        n = 1
        while self.i < len(self.s) and self.s[self.i] != "]":
            self.char()
            n += 1
            if self.i + 1 < len(self.s) and self.s[self.i] == "-" and self.s[self.i + 1] != "]":
                self.i += 1
                self.char()
        if self.i >= len(self.s):
            raise self.fail("unterminated character class")
        self.i += 1
        return n


def merge_ranges(ranges: list[tuple[int, int]]) -> Ranges:
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1] + 1:
            if hi > out[-1][1]:
                out[-1] = (out[-1][0], hi)
        else:
            out.append((lo, hi))
    return tuple(out)


def intersects(a: Ranges, b: Ranges) -> bool:
    i = j = 0
    while i < len(a) and j < len(b):
        if a[i][1] < b[j][0]:
            i += 1
        elif b[j][1] < a[i][0]:
            j += 1
        else:
            return True
    return False


def contains(ranges: Ranges, cp: int) -> bool:
    return any(lo <= cp <= hi for lo, hi in ranges)


_ESCAPED = {"t": "\t", "r": "\r", "n": "\n"}


def _decode(raw: str) -> str:
    """The text of a literal's (or class's) body, escapes resolved (they are valid here)."""
    if "\\" not in raw:
        return raw
    out = []
    i = 0
    while i < len(raw):
        c = raw[i]
        if c != "\\":
            out.append(c)
            i += 1
            continue
        e = raw[i + 1]
        width = _HEX_ESCAPES.get(e)
        if width is not None:
            out.append(chr(min(int(raw[i + 2 : i + 2 + width], 16), 0x10FFFF)))
            i += 2 + width
        else:
            out.append(_ESCAPED.get(e, e))
            i += 2
    return "".join(out)


def _class_ranges(body: str) -> Ranges:
    """The characters a ``[...]`` class body (between the brackets) matches."""
    negated = body.startswith("^")
    chars = _decode(body[1:] if negated else body)
    ranges: list[tuple[int, int]] = []
    i = 0
    while i < len(chars):
        lo = ord(chars[i])
        if i + 2 < len(chars) and chars[i + 1] == "-":
            ranges.append((lo, max(lo, ord(chars[i + 2]))))
            i += 3
        else:
            ranges.append((lo, lo))
            i += 1
    merged = merge_ranges(ranges)
    if not negated:
        return merged
    out: list[tuple[int, int]] = []
    nxt = 0
    for lo, hi in merged:
        if lo > nxt:
            out.append((nxt, lo - 1))
        nxt = hi + 1
    if nxt <= 0x10FFFF:
        out.append((nxt, 0x10FFFF))
    return tuple(out)
