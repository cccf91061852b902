"""How many grammar stacks llama.cpp can keep alive at once for a parsed GBNF grammar, with
the chain of leading references (the rest of :func:`app.runtimes.grammar.gbnf.measure`).
Tested by tests/runtimes/grammar/test_gbnf.py and tests/runtimes/grammar/test_limits.py."""

from __future__ import annotations

from app.runtimes.grammar.parse import (
    EPS,
    MAX_GRAMMAR_DEPTH,
    MAX_GRAMMAR_FANOUT,
    REF,
    TERM,
    UNBOUNDED,
    Grammar,
    GrammarError,
    GrammarShape,
    Item,
    Ranges,
    contains,
    intersects,
    merge_ranges,
)


class Analysis:
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

    def __init__(self, g: Grammar) -> None:
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
                    if lo == 0 or kind == EPS:
                        continue
                    left += 1
                    if kind == REF:
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

    def _item_nullable(self, it: Item) -> bool:
        return it[2] == 0 or it[0] == EPS or (it[0] == REF and self.nullable[it[1]])

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

    def _leading(self) -> tuple[list[int], int, list[Ranges], list[str | None]]:
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
                    if it[0] == REF:
                        out.append(it[1])
                    if not self._item_nullable(it):
                        break
            lead.append(out)
        depth = [0] * self.n
        fan = [0] * self.n
        first: list[Ranges] = [()] * self.n
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
                first[node] = merge_ranges(chars)
                if len(alts[node]) == 1:
                    key[node] = _alt_key(alts[node][0], key)
        return fan, max(depth, default=0), first, key

    @staticmethod
    def _fan(it: Item, fan: list[int]) -> int:
        return 1 if it[0] == TERM else 0 if it[0] == EPS else fan[it[1]]

    @staticmethod
    def _first(it: Item, first: list[Ranges]) -> Ranges:
        kind, target, _, _, info = it
        if kind == REF:
            return first[target]
        if isinstance(info, str):
            return ((ord(info[0]), ord(info[0])),)
        return info or ()

    def _groups(self, n: int, first: list[Ranges], key: list[str | None]) -> list[list[int]]:
        """The sets of ``n``'s alternatives that can be alive together (alternative indices)."""
        seqs = self.g.alts[n]
        if len(seqs) < 2:
            return [list(range(len(seqs)))]
        keyed: list[tuple[str, int]] = []
        other: list[tuple[Ranges, int]] = []
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
            other.append((merge_ranges(chars), a))
        groups: list[list[int]] = []
        keyed.sort()
        root = None
        for k, a in keyed:  # a literal and the ones it is a prefix of
            if root is None or not k.startswith(root):
                root = k
                cp = ord(k[0])
                groups.append([b for chars, b in other if contains(chars, cp)])
            groups[-1].append(a)
        if len(other) > 64:  # many alternatives without a literal: count them all together
            groups.append([a for _, a in other])
            return groups
        parent = list(range(len(other)))
        for i in range(len(other)):
            for j in range(i):
                if intersects(other[i][0], other[j][0]):
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
            [it[1] for seq in owner_alts for it in seq if it[0] == REF]
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
                if kind == TERM:
                    s_i, e_i, f_i = 1, 0, 1
                elif kind == EPS:
                    s_i, e_i, f_i = 0, 0, 0
                else:
                    s_i, e_i, f_i = width[target], ending[target], fan[target]
                # where item i can end: its own stacks, then the rest's (and itself again)
                at_end = e_i + rest + (f_i if hi == UNBOUNDED or hi > 1 else 0)
                here = s_i if s_i > at_end else at_end
                if here > w:
                    w = here
                if skippable and at_end > e:
                    e = at_end
                if lo == 0 or kind == EPS or (kind == REF and null[target]):
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


def _alt_key(seq: list[Item], key: list[str | None]) -> str | None:
    """The literal an alternative starts with, directly or through a one-alternative rule."""
    if not seq:
        return None
    kind, target, lo, hi, info = seq[0]
    if (lo, hi) != (1, 1):
        return None
    if kind == TERM and isinstance(info, str):
        return info
    return key[target] if kind == REF else None


def _find(parent: list[int], i: int) -> int:
    while parent[i] != i:
        parent[i] = parent[parent[i]]
        i = parent[i]
    return i


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
