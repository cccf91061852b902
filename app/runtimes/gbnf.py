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
_ESC = r"\\(?:[trn\\\"\[\]]|x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8})"
_ESC_RE = re.compile(_ESC)
_TOKEN_RE = re.compile(
    r"(?P<sp>(?:[ \t]|#[^\r\n]*)+)|(?P<nl>[\r\n])|(?P<word>[a-zA-Z0-9-]+)"
    rf'|(?P<lit>"(?:[^"\\]|{_ESC})*")|(?P<cls>\[\^?(?:[^\]\\]|{_ESC})*\])'
    r"|(?P<open>\()|(?P<close>\))|(?P<alt>\|)|(?P<dot>\.)|(?P<rep>[*+?{])"
)
_SIMPLE_ESCAPES = frozenset('trn\\"[]')
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


# An item of a sequence: (kind, target or element count, min repeats, max repeats or -1).
_Item = tuple[int, int, int, int]


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
            if kind == "word":
                seq.append((_REF, self.nonterminal(m.group()), 1, 1))
            elif kind == "lit":
                size = len(_ESC_RE.sub("e", s[m.start() + 1 : j - 1]))
                seq.append((_TERM, size, 1, 1) if size else (_EPS, 0, 1, 1))
            elif kind == "cls":
                seq.append((_TERM, 1 + len(_ESC_RE.sub("e", s[m.start() + 1 : j - 1])), 1, 1))
            elif kind == "dot":
                seq.append((_TERM, 1, 1, 1))
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
                frames[-1][1][-1].append((_REF, owner, 1, 1))
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
        kind, target, ilo, ihi = seq[-1]
        if (ilo, ihi) != (1, 1):  # a quantifier on a quantified item: nest it, as llama.cpp does
            inner = self.nonterminal()
            self.alts[inner] = [[seq[-1]]]
            kind, target = _REF, inner
        size = target if kind == _TERM else 1
        # llama.cpp copies the item `lo` times and adds one optional rule per further repeat
        extra = 1 if hi == _UNBOUNDED else hi - lo
        self.elements += size * max(lo - 1, 0) + extra * (size + 3)
        if self.elements > MAX_GRAMMAR_ELEMENTS:
            raise GrammarError(f"expands to more than {MAX_GRAMMAR_ELEMENTS} elements", "elements")
        seq[-1] = (kind, target, lo, hi)

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
    """Nullable rules, leading chains, and how many stacks a position can open (capped)."""

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
                for kind, target, lo, _ in seq:
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

    def shape(self) -> GrammarShape:
        fan, chain = self._leading()
        cap, null, alts = self.CAP, self.nullable, self.g.alts
        # One pass over every position of every alternative. After item i-1, the stacks open are
        # those the rest of the alternative starts (plus item i-1 again if it repeats), and, when
        # the rest can be skipped, those that follow the owner where it is used: p[owner].
        const = [0] * self.n  # stacks after a nonterminal ends, where what follows is required
        const[self.g.root] = 1  # the end of the input
        edges: list[list[tuple[int, int]]] = [[] for _ in range(self.n)]  # owner -> (child, add)
        fixed = min(cap, fan[self.g.root] + (1 if null[self.g.root] else 0))
        open_end: list[tuple[int, int]] = []  # (owner, most stacks before adding p[owner])
        for owner, owner_alts in enumerate(alts):
            for seq in owner_alts:
                rest, skippable = 0, True  # the suffix after position i
                worst_skippable = -1
                for i in range(len(seq) - 1, -1, -1):
                    kind, target, lo, hi = seq[i]
                    f = 1 if kind == _TERM else 0 if kind == _EPS else fan[target]
                    here = rest + (f if hi == _UNBOUNDED or hi > 1 else 0)
                    if here > cap:
                        here = cap
                    if skippable:
                        worst_skippable = max(worst_skippable, here)
                    elif here > fixed:
                        fixed = here
                    if kind == _REF:
                        if skippable:
                            edges[owner].append((target, here))
                        elif here > const[target]:
                            const[target] = here
                    if lo == 0 or kind == _EPS or (kind == _REF and null[target]):
                        rest = rest + f if rest + f < cap else cap
                    else:
                        rest, skippable = f, False
                if worst_skippable >= 0:
                    open_end.append((owner, worst_skippable))
        p = self._continuations(const, edges)
        worst = fixed
        for owner, local in open_end:
            worst = max(worst, min(cap, local + p[owner]))
        if worst > MAX_GRAMMAR_FANOUT:
            raise GrammarError(
                f"keeps more than {MAX_GRAMMAR_FANOUT} alternatives open at once (too many enum "
                f"values, optional properties or anyOf branches in reach of one another)",
                "fanout",
            )
        return GrammarShape(self.g.nesting, chain, self.g.elements, worst)

    def _leading(self) -> tuple[list[int], int]:
        """Stacks each nonterminal opens where it starts, and the longest chain of leading
        references (a cycle is left recursion, which llama.cpp refuses too)."""
        alts, null = self.g.alts, self.nullable
        lead: list[list[int]] = []
        for owner_alts in alts:
            out: list[int] = []
            for seq in owner_alts:
                for kind, target, lo, _ in seq:
                    if kind == _REF:
                        out.append(target)
                    if not (lo == 0 or kind == _EPS or (kind == _REF and null[target])):
                        break
            lead.append(out)
        depth = [0] * self.n
        fan = [0] * self.n
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
                for seq in alts[node]:
                    for kind, target, lo, _ in seq:
                        total += 1 if kind == _TERM else 0 if kind == _EPS else fan[target]
                        if not (lo == 0 or kind == _EPS or (kind == _REF and null[target])):
                            break
                fan[node] = min(self.CAP, total)
        return fan, max(depth, default=0)

    def _continuations(self, const: list[int], edges: list[list[tuple[int, int]]]) -> list[int]:
        """For each nonterminal, the most stacks that continue after it ends: ``const`` where
        what follows it is required, else what follows plus its owner's continuation (along
        ``edges``, owner -> (child, stacks added))."""
        comp = _components(self.n, [[c for c, _ in out] for out in edges])
        # a cycle of skippable endings that adds stacks each time round grows without bound
        for owner, out in enumerate(edges):
            for child, add in out:
                if add and comp[owner] == comp[child]:
                    raise GrammarError(
                        "can open more alternatives with each level of recursion", "fanout"
                    )
        n_comp = max(comp, default=-1) + 1
        value = [0] * n_comp
        for node in range(self.n):
            value[comp[node]] = max(value[comp[node]], const[node])
        incoming: list[list[tuple[int, int]]] = [[] for _ in range(n_comp)]
        for owner, out in enumerate(edges):
            for child, add in out:
                if comp[owner] != comp[child]:
                    incoming[comp[child]].append((comp[owner], add))
        # _components numbers components in reverse topological order: owners come later
        for c in range(n_comp - 1, -1, -1):
            for src, add in incoming[c]:
                value[c] = max(value[c], min(self.CAP, value[src] + add))
        return [value[comp[node]] for node in range(self.n)]


def _repeats(it: _Item) -> bool:
    return it[3] == _UNBOUNDED or it[3] > 1


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
