"""The shape of a GBNF grammar, measured before llama.cpp parses it (defence in depth behind the
schema bounds of ``app/core/constraints.py``).

llama.cpp's grammar code recurses, and each grammar stack costs every token:

- its parser recurses once per nested group: measured here, about 450 bytes of stack a level
  (an 8 MiB stack overflowed at 18,700 levels, a 512 KiB thread stack at 1,150);
- its left-recursion check and its stack expansion recurse once per rule referenced at the start
  of a rule, and the stacks they build grow with the square of that chain (16,000: 1.6 GB, 6 s);
- every alternative open at a position is one grammar stack that each sampled token is checked
  against: about 0.5 ms per stack per token on SmolLM2's 49k vocabulary (an enum of 1,000 values
  made every token take 0.5 s).

:func:`check_grammar` parses the text the way llama.cpp does (iteratively: no recursion here),
measures those four numbers and refuses a grammar over the bounds. A grammar llama.cpp would
reject as malformed (an escape it does not know, such as ``\\d`` from a pattern) is refused here
too, so llama.cpp never prints it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from app.core.constraints import MAX_REPEAT
from app.errors import InvalidRequest

MAX_GRAMMAR_BYTES = 256 * 1024
# Group nesting and leading-reference chains. A schema within the bounds of
# app/core/constraints.py nests about 1,050 at most (maxLength 1000 is 1,000 nested groups); the
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
_TERM, _EPS, _REF = 0, 1, 2
_UNBOUNDED = -1


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


def check_grammar(text: str, *, param: str) -> GrammarShape:
    """Measure ``text`` and refuse it over a bound.

    Raises:
        InvalidRequest: malformed, or over MAX_GRAMMAR_BYTES / DEPTH / ELEMENTS / FANOUT.
    """
    size = len(text.encode())
    if size > MAX_GRAMMAR_BYTES:
        raise InvalidRequest(
            f"the output constraint makes a grammar of {size} bytes; at most "
            f"{MAX_GRAMMAR_BYTES} are allowed",
            param=param,
        )
    try:
        return measure(text)
    except GrammarError as e:
        if e.bound is None:
            raise InvalidRequest(
                f"the output constraint makes a grammar llama.cpp cannot parse: {e}", param=param
            ) from e
        raise InvalidRequest(f"the output constraint makes a grammar that {e}", param=param) from e


def measure(text: str) -> GrammarShape:
    """Parse ``text`` (GBNF, llama.cpp's dialect) and measure it.

    Raises:
        GrammarError: malformed, or over a bound (parsing stops there).
    """
    g = _Parser(text).parse()
    return _Analysis(g).shape()


# Character sets as sorted, merged (first, last) code point ranges.
_Ranges = tuple[tuple[int, int], ...]
_ALL: _Ranges = ((0, 0x10FFFF),)
# An item of a sequence: (kind, target or element count, min repeats, max repeats or -1, what a
# terminal matches: a literal's text, or a class's ranges; None for rule references).
_Item = tuple[int, int, int, int, "str | _Ranges | None"]


@dataclass
class _Grammar:
    alts: list[list[list[_Item]]]  # per nonterminal (rules, then groups): its alternatives
    root: int
    nesting: int
    elements: int


class _Parser:
    """llama.cpp's grammar syntax: rules ``name ::= alternatives``, literals, classes, groups,
    ``* + ? {m} {m,} {m,n}``; groups become nonterminals as llama.cpp makes them sub-rules."""

    def __init__(self, text: str) -> None:
        self.s = text
        self.i = 0
        self.names: dict[str, int] = {}
        self.defined: set[int] = set()
        self.alts: list[list[list[_Item]]] = []
        self.nesting = 0
        self.elements = 0
        self.quantified = False  # the last item has its repetition already

    def fail(self, why: str) -> GrammarError:
        return GrammarError(f"{why} at offset {self.i}")

    def parse(self) -> _Grammar:
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
        return _Grammar(self.alts, self.names["root"], self.nesting, self.elements)

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
        frames: list[tuple[int, list[list[_Item]]]] = [(rule, [[]])]
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
                seq.append((_REF, self.nonterminal(m.group()), 1, 1, None))
            elif kind == "lit":
                text = _decode(s[m.start() + 1 : j - 1])
                seq.append((_TERM, len(text), 1, 1, text) if text else (_EPS, 0, 1, 1, None))
            elif kind == "cls":
                ranges = _class_ranges(s[m.start() + 1 : j - 1])
                seq.append((_TERM, 1 + len(ranges), 1, 1, ranges))
            elif kind == "dot":
                seq.append((_TERM, 1, 1, 1, _ALL))
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
                frames[-1][1][-1].append((_REF, owner, 1, 1, None))
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

    def repetition(self, seq: list[_Item], c: str) -> None:
        if not seq:
            raise self.fail(f"expecting an item before {c!r}")
        self.i += 1
        if c == "*":
            lo, hi = 0, _UNBOUNDED
        elif c == "+":
            lo, hi = 1, _UNBOUNDED
        elif c == "?":
            lo, hi = 0, 1
        else:
            lo, hi = self.braces()
        kind, target, _, _, info = seq[-1]
        if self.quantified:
            raise self.fail(f"expecting an item before {c!r}")  # llama.cpp refuses "a**" too
        self.quantified = True
        size = target if kind == _TERM else 1
        # llama.cpp copies the item `lo` times and adds one optional rule per further repeat
        extra = 1 if hi == _UNBOUNDED else hi - lo
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
        if hi != _UNBOUNDED and hi < lo:
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


class _Analysis:
    """Nullable rules, leading chains, and how many grammar stacks can be alive at once.

    llama.cpp keeps one stack per way the text so far can be read. Inside a rule, the stacks of
    its alternatives add up while they can match the same text; alternatives that begin with
    different literals (``"\\"p1\\""`` and ``"\\"p2\\""``), or with characters no other
    one starts with, part ways at once and only the widest of them counts. Within a sequence,
    the items that follow one are alive only where it can end. So for every nonterminal:
    ``width`` the most stacks alive inside it, ``ending`` the most alive inside it where it can
    also be complete (what follows it is alive then too). Both are upper bounds, capped at CAP.
    """

    CAP = MAX_GRAMMAR_FANOUT + 1

    def __init__(self, g: _Grammar) -> None:
        self.g = g
        self.n = len(g.alts)
        self.nullable = self._nullable()

    def _nullable(self) -> list[bool]:
        alts = self.g.alts
        null = [False] * self.n
        # per alternative, the items not yet known to be nullable; zero makes its owner nullable
        pending: list[list[int]] = []
        waiting: list[list[tuple[int, int]]] = [[] for _ in range(self.n)]
        ready: list[int] = []
        for owner, owner_alts in enumerate(alts):
            row = []
            for a, seq in enumerate(owner_alts):
                left = 0
                for kind, target, lo, _, _ in seq:
                    if lo == 0 or kind == _EPS:
                        continue
                    left += 1
                    if kind == _REF:
                        waiting[target].append((owner, a))
                    else:
                        left += 1 << 30  # a terminal: never nullable
                row.append(left)
                if left == 0:
                    ready.append(owner)
            pending.append(row)
        while ready:
            t = ready.pop()
            if null[t]:
                continue
            null[t] = True
            for owner, a in waiting[t]:
                pending[owner][a] -= 1  # a rule repeated in one alternative waits once per use
                if pending[owner][a] == 0:
                    ready.append(owner)
        return null

    def _item_nullable(self, it: _Item) -> bool:
        return it[2] == 0 or it[0] == _EPS or (it[0] == _REF and self.nullable[it[1]])

    def shape(self) -> GrammarShape:
        fan, chain, first, key = self._leading()
        groups = [self._groups(n, first, key) for n in range(self.n)]
        width, ending = self._widths(fan, groups)
        root = self.g.root
        worst = max(width[root], ending[root] + 1)  # + 1: the end of the input
        if worst > MAX_GRAMMAR_FANOUT:
            raise GrammarError(
                f"can keep more than {MAX_GRAMMAR_FANOUT} grammar stacks alive at once (enum "
                f"values, optional properties or anyOf branches that can all match the same text)",
                "fanout",
            )
        return GrammarShape(self.g.nesting, chain, self.g.elements, worst)

    def _leading(self) -> tuple[list[int], int, list[_Ranges], list[str | None]]:
        """In one pass over the leading references (a cycle is left recursion, which llama.cpp
        refuses too), for each nonterminal: the stacks it opens where it starts, the longest
        chain of leading references, the characters it can start with, and the literal it
        starts with when it has one alternative that does."""
        alts = self.g.alts
        lead: list[list[int]] = []
        for owner_alts in alts:
            out: list[int] = []
            for seq in owner_alts:
                for it in seq:
                    if it[0] == _REF:
                        out.append(it[1])
                    if not self._item_nullable(it):
                        break
            lead.append(out)
        depth = [0] * self.n
        fan = [0] * self.n
        first: list[_Ranges] = [()] * self.n
        key: list[str | None] = [None] * self.n
        state = [0] * self.n  # 0 new, 1 on the path, 2 done
        for start in range(self.n):
            if state[start]:
                continue
            path: list[tuple[int, int]] = [(start, 0)]
            state[start] = 1
            while path:
                node, k = path[-1]
                if k < len(lead[node]):
                    path[-1] = (node, k + 1)
                    child = lead[node][k]
                    if state[child] == 1:
                        raise GrammarError("is left-recursive")
                    if state[child] == 0:
                        state[child] = 1
                        path.append((child, 0))
                    continue
                path.pop()
                state[node] = 2
                depth[node] = 1 + max((depth[c] for c in lead[node]), default=0)
                if depth[node] > MAX_GRAMMAR_DEPTH:
                    raise GrammarError(
                        f"chains more than {MAX_GRAMMAR_DEPTH} rules at the start of a rule",
                        "depth",
                    )
                total = 0
                chars: list[tuple[int, int]] = []
                for seq in alts[node]:
                    for it in seq:
                        total += self._fan(it, fan)
                        chars.extend(self._first(it, first))
                        if not self._item_nullable(it):
                            break
                fan[node] = min(self.CAP, total)
                first[node] = _merge(chars)
                if len(alts[node]) == 1:
                    key[node] = _alt_key(alts[node][0], key)
        return fan, max(depth, default=0), first, key

    @staticmethod
    def _fan(it: _Item, fan: list[int]) -> int:
        return 1 if it[0] == _TERM else 0 if it[0] == _EPS else fan[it[1]]

    @staticmethod
    def _first(it: _Item, first: list[_Ranges]) -> _Ranges:
        kind, target, _, _, info = it
        if kind == _REF:
            return first[target]
        if isinstance(info, str):
            return ((ord(info[0]), ord(info[0])),)
        return info or ()

    def _groups(self, n: int, first: list[_Ranges], key: list[str | None]) -> list[list[int]]:
        """The sets of ``n``'s alternatives that can be alive together (alternative indices)."""
        seqs = self.g.alts[n]
        if len(seqs) < 2:
            return [list(range(len(seqs)))]
        keyed: list[tuple[str, int]] = []
        other: list[tuple[_Ranges, int]] = []
        for a, seq in enumerate(seqs):
            k = _alt_key(seq, key)
            if k is not None:
                keyed.append((k, a))
                continue
            chars: list[tuple[int, int]] = []
            for it in seq:
                chars.extend(self._first(it, first))
                if not self._item_nullable(it):
                    break
            other.append((_merge(chars), a))
        groups: list[list[int]] = []
        keyed.sort()
        root = None
        for k, a in keyed:  # a literal and the ones it is a prefix of
            if root is None or not k.startswith(root):
                root = k
                cp = ord(k[0])
                groups.append([b for chars, b in other if _contains(chars, cp)])
            groups[-1].append(a)
        if len(other) > 64:  # many alternatives without a literal: count them all together
            groups.append([a for _, a in other])
            return groups
        parent = list(range(len(other)))
        for i in range(len(other)):
            for j in range(i):
                if _intersects(other[i][0], other[j][0]):
                    parent[_find(parent, i)] = _find(parent, j)
        together: dict[int, list[int]] = {}
        for i, (_, a) in enumerate(other):
            together.setdefault(_find(parent, i), []).append(a)
        groups.extend(together.values())
        return groups

    def _widths(self, fan: list[int], groups: list[list[list[int]]]) -> tuple[list[int], list[int]]:
        """``width`` and ``ending`` of every nonterminal, references before their users (the
        rules of one cycle together, until they settle; still growing after 64 rounds means
        each level of recursion opens more stacks)."""
        width = [0] * self.n
        ending = [0] * self.n
        succ = [
            [it[1] for seq in owner_alts for it in seq if it[0] == _REF]
            for owner_alts in self.g.alts
        ]
        comp = _components(self.n, succ)
        members: list[list[int]] = [[] for _ in range(max(comp, default=-1) + 1)]
        for node in range(self.n):
            members[comp[node]].append(node)
        for nodes in members:  # references get lower numbers than their users
            cyclic = len(nodes) > 1 or nodes[0] in succ[nodes[0]]
            for _ in range(64 if cyclic else 1):
                changed = False
                for node in nodes:
                    w, e = self._evaluate(node, fan, groups[node], width, ending)
                    if w > width[node] or e > ending[node]:
                        width[node] = max(width[node], w)
                        ending[node] = max(ending[node], e)
                        changed = True
                if not changed:
                    break
            else:
                if cyclic and changed:
                    raise GrammarError(
                        "can open more grammar stacks with each level of recursion", "fanout"
                    )
        return width, ending

    def _evaluate(
        self,
        node: int,
        fan: list[int],
        groups: list[list[int]],
        width: list[int],
        ending: list[int],
    ) -> tuple[int, int]:
        cap, null = self.CAP, self.nullable
        w_alt: list[int] = []
        e_alt: list[int] = []
        for seq in self.g.alts[node]:
            rest, skippable = 0, True  # stacks the items after i open; can they all be skipped
            w, e = 0, -1
            for i in range(len(seq) - 1, -1, -1):
                kind, target, lo, hi, _ = seq[i]
                if kind == _TERM:
                    s_i, e_i, f_i = 1, 0, 1
                elif kind == _EPS:
                    s_i, e_i, f_i = 0, 0, 0
                else:
                    s_i, e_i, f_i = width[target], ending[target], fan[target]
                # where item i can end: its own stacks, then the rest's (and itself again)
                at_end = e_i + rest + (f_i if hi == _UNBOUNDED or hi > 1 else 0)
                here = s_i if s_i > at_end else at_end
                if here > w:
                    w = here
                if skippable and at_end > e:
                    e = at_end
                if lo == 0 or kind == _EPS or (kind == _REF and null[target]):
                    rest = rest + f_i if rest + f_i < cap else cap
                else:
                    rest, skippable = f_i, False
            w_alt.append(min(w, cap))
            e_alt.append(min(e, cap))
        width_n = fan[node]
        ending_n = 0
        for group in groups:
            total = sum(w_alt[a] for a in group)
            width_n = max(width_n, total)
            for a in group:
                if e_alt[a] >= 0:
                    ending_n = max(ending_n, total - w_alt[a] + e_alt[a])
        return min(width_n, cap), min(ending_n, cap)


def _alt_key(seq: list[_Item], key: list[str | None]) -> str | None:
    """The literal an alternative starts with, directly or through a one-alternative rule."""
    if not seq:
        return None
    kind, target, lo, hi, info = seq[0]
    if (lo, hi) != (1, 1):
        return None
    if kind == _TERM and isinstance(info, str):
        return info
    return key[target] if kind == _REF else None


def _find(parent: list[int], i: int) -> int:
    while parent[i] != i:
        parent[i] = parent[parent[i]]
        i = parent[i]
    return i


def _merge(ranges: list[tuple[int, int]]) -> _Ranges:
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1] + 1:
            if hi > out[-1][1]:
                out[-1] = (out[-1][0], hi)
        else:
            out.append((lo, hi))
    return tuple(out)


def _intersects(a: _Ranges, b: _Ranges) -> bool:
    i = j = 0
    while i < len(a) and j < len(b):
        if a[i][1] < b[j][0]:
            i += 1
        elif b[j][1] < a[i][0]:
            j += 1
        else:
            return True
    return False


def _contains(ranges: _Ranges, cp: int) -> bool:
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


def _class_ranges(body: str) -> _Ranges:
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
    merged = _merge(ranges)
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


def _components(n: int, succ: list[list[int]]) -> list[int]:
    """Strongly connected components (Tarjan's, iterative); numbered so that every edge goes
    from a higher or equal number to a lower or equal one."""
    index = [-1] * n
    low = [0] * n
    on_stack = [False] * n
    comp = [-1] * n
    stack: list[int] = []
    counter = 0
    n_comp = 0
    for root in range(n):
        if index[root] >= 0:
            continue
        work: list[tuple[int, int]] = [(root, 0)]
        while work:
            v, k = work[-1]
            if k == 0:
                index[v] = low[v] = counter
                counter += 1
                stack.append(v)
                on_stack[v] = True
            if k < len(succ[v]):
                work[-1] = (v, k + 1)
                w = succ[v][k]
                if index[w] < 0:
                    work.append((w, 0))
                elif on_stack[w]:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                u = work[-1][0]
                low[u] = min(low[u], low[v])
            if low[v] == index[v]:
                while True:
                    w = stack.pop()
                    on_stack[w] = False
                    comp[w] = n_comp
                    if w == v:
                        break
                n_comp += 1
    return comp
