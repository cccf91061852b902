"""Bounds on the output constraints a client sends: JSON schemas and the regexes inside them.

A runtime turns a schema into a grammar, and the grammar grows with the counts in the schema:
llama-cpp-python's converter writes ``maxLength: 32000`` as a 32,000-deep nest of optional
groups, which overflowed llama.cpp's recursive grammar parser (SIGSEGV), and ``minItems:
20000000`` as twenty million copies of the item rule (1.9 GB). Every protocol's parser calls
:func:`check_schemas` before anything expands, so each bound is written once, here; the runtimes
bound the final grammar again (``app/runtimes/grammar/gbnf.py`` for llama.cpp).

The conversion itself grows faster than the schema: llama-cpp-python's converter writes an
object's optional properties as one alternative per starting property, each a chain of rules
naming the rest, so its work is the square of the optional properties times the length of the
rule names (the schema path), and times the names that escape to the same rule name (it probes
``name0``, ``name1``... for each): 950 optional properties took 6-10 s of CPU before the grammar
was refused. :data:`MAX_SCHEMA_COST` bounds that estimate before anything converts.

Every refusal is an :class:`InvalidRequest` whose message names the bound and its number and
whose ``param`` points at the keyword (``response_format.json_schema.schema.properties.name.
maxLength``).
"""

from __future__ import annotations

import collections
import json
import math
import re
from collections.abc import Iterable
from typing import Any

from app.errors import InvalidRequest

MAX_SCHEMA_BYTES = 64 * 1024  # one schema, as compact JSON
MAX_CONSTRAINT_BYTES = 256 * 1024  # all the schemas one request enforces (a forced tool call)
MAX_SCHEMA_DEPTH = 32  # JSON nesting levels
# Any one count keyword or regex quantifier, nested quantifiers multiplied: each unit is one
# level of grammar nesting in llama.cpp (which itself refuses a maxLength over 1000).
MAX_REPEAT = 1000
MAX_TOTAL_REPEAT = 20_000  # the counts of all the schemas of one request, added up
MAX_CHOICES = 256  # enum values; anyOf / oneOf / allOf branches
MAX_PATTERN_NESTING = 32  # groups inside groups in one regex
MAX_FORMAT_CHARS = 64
MAX_PROPERTIES = 1024  # properties of one object
MAX_TOTAL_PROPERTIES = 4096  # properties of all the objects of one request's schemas
MAX_OPTIONAL_PROPERTIES = 256  # properties of one object that are not in its 'required'
# The conversion's estimated work, added up over a request's objects: optional properties
# squared, times (1 + rule-name length / 64), times (1 + same-named properties / 16). 256
# optional properties at the root, or four objects of 128, convert in about 60 ms; the
# measured cost of the largest accepted schemas is in tests/bench/grammar_compile.py.
MAX_SCHEMA_COST = 1 << 17
_RULE_NAME_UNIT = 64
_COLLISION_UNIT = 16
_RULE_CHARS = re.compile(r"[^a-zA-Z0-9-]+")  # what the converter turns into "-" in rule names

COUNT_KEYWORDS = (
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
    "minProperties",
    "maxProperties",
    "minContains",
    "maxContains",
)
_PAIRS = tuple(zip(COUNT_KEYWORDS[::2], COUNT_KEYWORDS[1::2], strict=True))
_CHOICE_LISTS = ("enum", "anyOf", "oneOf", "allOf")
# values, not schemas: their contents are data (a default may well hold {"pattern": "*.py"})
_DATA_KEYWORDS = frozenset({"enum", "const", "default", "examples", "description", "title"})
# objects whose keys are names and whose values are schemas
_MAP_KEYWORDS = frozenset(
    {"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"}
)


def json_depth(v: Any, limit: int) -> int:
    """Nesting depth of a JSON value, iteratively (a hostile value can be very deep); stops
    counting once past ``limit``."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(v, 1)]
    while stack:
        node, d = stack.pop()
        deepest = max(deepest, d)
        if deepest > limit:
            return deepest
        if isinstance(node, dict):
            stack.extend((x, d + 1) for x in node.values())
        elif isinstance(node, list):
            stack.extend((x, d + 1) for x in node)
    return deepest


def schema_json(schema: Any, *, param: str) -> str:
    """The schema as compact JSON, refused when deeper than MAX_SCHEMA_DEPTH or larger than
    MAX_SCHEMA_BYTES. Only shape and size: :func:`check_schemas` bounds what it expands to."""
    if not isinstance(schema, dict):
        raise InvalidRequest("a JSON schema must be an object", param=param)
    if json_depth(schema, MAX_SCHEMA_DEPTH) > MAX_SCHEMA_DEPTH:
        raise InvalidRequest(
            f"the schema is nested deeper than {MAX_SCHEMA_DEPTH} levels", param=param
        )
    raw = json.dumps(schema, separators=(",", ":"))
    if len(raw.encode()) > MAX_SCHEMA_BYTES:
        raise InvalidRequest(
            f"the schema is larger than {MAX_SCHEMA_BYTES} bytes ({len(raw.encode())})",
            param=param,
        )
    return raw


def check_schema(schema: Any, *, param: str) -> str:
    """Validate one schema that will be enforced as a grammar; returns it as compact JSON.

    Raises:
        InvalidRequest: a bound is crossed or a pattern is not a valid regex.
    """
    return check_schemas([(schema, param)])[0]


def check_schemas(items: Iterable[tuple[Any, str]]) -> list[str]:
    """Validate the schemas one request enforces together (``(schema, param)`` each), with the
    total bounds shared; returns each as compact JSON.

    Raises:
        InvalidRequest: a bound is crossed or a pattern is not a valid regex.
    """
    budget = _Budget()
    out = []
    for schema, param in items:
        raw = schema_json(schema, param=param)
        budget.bytes += len(raw.encode())
        if budget.bytes > MAX_CONSTRAINT_BYTES:
            raise InvalidRequest(
                f"the schemas of this request add up to more than {MAX_CONSTRAINT_BYTES} bytes",
                param=param,
            )
        _walk(schema, param, budget)
        out.append(raw)
    return out


class _Budget:
    __slots__ = ("bytes", "cost", "properties", "repeat")

    def __init__(self) -> None:
        self.bytes = 0
        self.repeat = 0
        self.properties = 0
        self.cost = 0

    def spend(self, n: int, param: str) -> None:
        self.repeat += n
        if self.repeat > MAX_TOTAL_REPEAT:
            raise InvalidRequest(
                f"the counts and quantifiers of this request's schemas add up to "
                f"{self.repeat}; at most {MAX_TOTAL_REPEAT} are allowed, since each one "
                f"expands into the grammar that enforces it",
                param=param,
            )


def _at(param: str, key: str | int) -> str:
    return f"{param}[{key}]" if isinstance(key, int) else f"{param}.{key}"


def _walk(root: dict[str, Any], param: str, budget: _Budget) -> None:
    """Every schema object under ``root`` (and every local ``$ref`` target), iteratively."""
    seen: set[int] = set()
    # (value, where, is_map, rule name length): a map's keys are names (a property may be called
    # "maxLength"); the converter names each rule by its path, and a ref's target by its last part
    stack: list[tuple[Any, str, bool, int]] = [(root, param, False, _ROOT_RULE_NAME)]
    while stack:
        node, where, is_map, name_len = stack.pop()
        if isinstance(node, list):
            stack.extend((v, _at(where, i), False, name_len) for i, v in enumerate(node))
            continue
        if not isinstance(node, dict) or id(node) in seen:
            continue
        seen.add(id(node))
        if is_map:
            stack.extend((v, _at(where, k), False, name_len + 1 + len(k)) for k, v in node.items())
            continue
        _check_counts(node, where, budget)
        _check_object(root, node, where, name_len, budget)
        for key, v in node.items():
            here = _at(where, key)
            if key in _CHOICE_LISTS and isinstance(v, list) and len(v) > MAX_CHOICES:
                raise InvalidRequest(
                    f"'{key}' has {len(v)} entries; at most {MAX_CHOICES} are allowed",
                    param=here,
                )
            if key == "pattern" and isinstance(v, str):
                budget.spend(check_pattern(v, param=here), here)
            elif key == "patternProperties" and isinstance(v, dict):
                for pat in v:
                    budget.spend(check_pattern(pat, param=here), here)
            elif key == "format" and isinstance(v, str) and len(v) > MAX_FORMAT_CHARS:
                raise InvalidRequest(
                    f"'format' is longer than {MAX_FORMAT_CHARS} characters", param=here
                )
            elif key == "$ref" and isinstance(v, str):
                target = _resolve(root, v)
                if target is not None:  # a missing target is the runtime's 400 to give
                    stack.append((target, here, False, len(v.rsplit("/", 1)[-1])))
            if key not in _DATA_KEYWORDS and isinstance(v, dict | list):
                is_names = key in _MAP_KEYWORDS and isinstance(v, dict)
                stack.append((v, here, is_names, name_len + (0 if is_names else _STEP_NAME)))


# rule-name lengths: a forced call's arguments start at "tool-N-arguments"; an item, a tuple
# member or a union branch adds a suffix of a few characters ("-item", "-3")
_ROOT_RULE_NAME = 20
_STEP_NAME = 6


def _check_object(
    root: dict[str, Any], node: dict[str, Any], where: str, name_len: int, budget: _Budget
) -> None:
    """Bound an object's properties, and add its conversion's estimated work to the budget."""
    found = _object_properties(root, node)
    if found is None:
        return
    names, optional = found
    here = _at(where, "properties")
    if len(names) > MAX_PROPERTIES:
        raise InvalidRequest(
            f"an object has {len(names)} properties; at most {MAX_PROPERTIES} are allowed",
            param=here,
        )
    budget.properties += len(names)
    if budget.properties > MAX_TOTAL_PROPERTIES:
        raise InvalidRequest(
            f"the objects of this request's schemas have more than {MAX_TOTAL_PROPERTIES} "
            f"properties in all",
            param=here,
        )
    if optional > MAX_OPTIONAL_PROPERTIES:
        raise InvalidRequest(
            f"an object has {optional} optional properties (not in 'required'); at most "
            f"{MAX_OPTIONAL_PROPERTIES} are allowed, since the grammar that enforces them grows "
            f"with their square",
            param=here,
        )
    if optional < 2 or not names:
        return
    rule_len = name_len + 1 + max(len(k) for k in names)
    same = max(collections.Counter(_RULE_CHARS.sub("-", k) for k in names).values())
    cost = (
        optional
        * optional
        * (_RULE_NAME_UNIT + rule_len)
        * (_COLLISION_UNIT + same - 1)
        // (_RULE_NAME_UNIT * _COLLISION_UNIT)
    )
    budget.cost += cost
    if budget.cost > MAX_SCHEMA_COST:
        raise InvalidRequest(
            f"the optional properties of this request's schemas would cost {budget.cost} units "
            f"to convert into a grammar (this object, with {optional} optional properties "
            f"under names of up to {rule_len} characters: {cost}); at most {MAX_SCHEMA_COST} "
            f"are allowed. Mark properties required, or use fewer or shorter names",
            param=here,
        )


def _object_properties(root: dict[str, Any], node: dict[str, Any]) -> tuple[list[str], int] | None:
    """(property names, how many are optional) of an object that the converter writes as one
    rule, or None. ``allOf`` components are merged into one object, as the converter does
    (those under an ``anyOf`` optional)."""
    extra = node.get("additionalProperties")
    any_extra = 1 if extra is True or isinstance(extra, dict) else 0
    props = node.get("properties")
    if isinstance(props, dict):
        required = node.get("required")
        req = {r for r in required if isinstance(r, str)} if isinstance(required, list) else set()
        return list(props), sum(1 for k in props if k not in req) + any_extra
    parts = node.get("allOf")
    if not isinstance(parts, list):
        return ([], 1) if isinstance(extra, dict) else None
    names: list[str] = []
    maybe: list[str] = []
    for part in parts:
        alts = part.get("anyOf") if isinstance(part, dict) else None
        for comp in alts if isinstance(alts, list) else [part]:
            if isinstance(comp, dict) and isinstance(comp.get("$ref"), str):
                comp = _resolve(root, comp["$ref"])
            if isinstance(comp, dict) and isinstance(comp.get("properties"), dict):
                (maybe if isinstance(alts, list) else names).extend(comp["properties"])
    required_names = set(names)
    return names + maybe, sum(1 for k in maybe if k not in required_names)


def _check_counts(node: dict[str, Any], where: str, budget: _Budget) -> None:
    values: dict[str, int] = {}
    for key in COUNT_KEYWORDS:
        v = node.get(key)
        if v is None or isinstance(v, dict | list):
            continue  # absent, or a property that happens to be named like the keyword
        here = _at(where, key)
        if (
            isinstance(v, bool)
            or not isinstance(v, int | float)
            or not math.isfinite(v)
            or v < 0
            or v != int(v)
        ):
            raise InvalidRequest(f"'{key}' must be a non-negative integer", param=here)
        if v > MAX_REPEAT:
            raise InvalidRequest(
                f"'{key}' is {int(v)}; counts (minLength, maxLength, minItems, maxItems, "
                f"minProperties, ...) can be at most {MAX_REPEAT}, since each one expands into "
                f"the grammar that enforces it",
                param=here,
            )
        values[key] = int(v)
    for lo, hi in _PAIRS:
        if lo in values and hi in values and values[lo] > values[hi]:
            raise InvalidRequest(
                f"'{lo}' ({values[lo]}) is larger than '{hi}' ({values[hi]})",
                param=_at(where, lo),
            )
        n = max(values.get(lo, 0), values.get(hi, 0))
        if n:
            budget.spend(n, _at(where, hi if hi in values else lo))


def _resolve(root: dict[str, Any], ref: str) -> Any:
    """A local ``#/a/b`` reference's target, or None (remote, anchors, missing)."""
    if ref == "#":
        return root
    if not ref.startswith("#/"):
        return None
    node: Any = root
    for part in ref[2:].split("/"):
        key = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict):
            node = node.get(part, node.get(key))
        elif isinstance(node, list) and key.isdigit() and int(key) < len(node):
            node = node[int(key)]
        else:
            return None
        if node is None:
            return None
    return node


# -- regular expressions (JSON Schema's ``pattern``: ECMA-262 syntax) --------------------------
_CLASS_ESCAPES = frozenset("dDwWsSbBnrtfv0")
_QUANTIFIER_CHARS = frozenset("*+?{")


def check_pattern(pattern: str, *, param: str) -> int:
    """Check a ``pattern`` regex: balanced groups and classes, known escapes, quantifiers that
    follow something and stay within MAX_REPEAT (nested ones multiplied). Returns how much the
    pattern expands (its quantifiers' counts, weighted by the ones around them).

    Raises:
        InvalidRequest: the pattern is invalid or crosses a bound.
    """
    p = _PatternScan(pattern, param)
    return p.run()


class _PatternScan:
    """One left-to-right pass with an explicit stack of open groups (no recursion)."""

    def __init__(self, pattern: str, param: str) -> None:
        self.s = pattern
        self.param = param
        self.i = 0

    def fail(self, why: str) -> InvalidRequest:
        return InvalidRequest(
            f"'pattern' is not a valid regular expression: {why} at position {self.i} of "
            f"{self.s[:80]!r}",
            param=self.param,
        )

    def run(self) -> int:
        s, n = self.s, len(self.s)
        # per open group: [largest nested product, summed expansion] of what it holds so far
        groups: list[list[int]] = [[1, 0]]
        last: tuple[int, int] | None = None  # (product, expansion) of the atom a quantifier takes
        while self.i < n:
            c = s[self.i]
            if c == "(":
                if len(groups) > MAX_PATTERN_NESTING:
                    raise InvalidRequest(
                        f"'pattern' nests groups deeper than {MAX_PATTERN_NESTING} levels",
                        param=self.param,
                    )
                self._group_prefix()
                groups.append([1, 0])
                last = None
                continue
            if c == ")":
                if len(groups) == 1:
                    raise self.fail("unbalanced ')'")
                prod, total = groups.pop()
                outer = groups[-1]
                outer[0] = max(outer[0], prod)
                outer[1] += total
                self.i += 1
                last = (prod, total)
                continue
            if c in _QUANTIFIER_CHARS:
                if last is None:
                    raise self.fail(f"nothing to repeat before {c!r}")
                count = self._quantifier()
                times = max(count, 1)
                prod, total = last
                prod *= times
                if count > MAX_REPEAT or prod > MAX_REPEAT:
                    what = "a quantifier" if count > MAX_REPEAT else "nested quantifiers"
                    raise InvalidRequest(
                        f"'pattern' repeats {count if count > MAX_REPEAT else prod} times in "
                        f"{what}; at most {MAX_REPEAT} are allowed (nested quantifiers multiply)",
                        param=self.param,
                    )
                g = groups[-1]
                g[0] = max(g[0], prod)
                g[1] += total * (times - 1) + count  # the atom's own expansion is in g already
                last = None  # a quantifier cannot follow a quantifier ("a**")
                if self.i < n and s[self.i] == "?":
                    self.i += 1  # lazy
                continue
            if c == "|" or c == "^" or c == "$":
                self.i += 1
                last = None
                continue
            if c == "[":
                self._char_class()
            elif c == "\\":
                self._escape(in_class=False)
            elif c in "]}":
                raise self.fail(f"unescaped {c!r}")
            else:
                self.i += 1
            last = (1, 0)
        if len(groups) > 1:
            raise self.fail("unclosed group '('")
        return groups[0][1]

    def _group_prefix(self) -> None:
        s = self.s
        self.i += 1
        if s.startswith("?", self.i):
            for prefix in ("?:", "?=", "?!", "?<=", "?<!"):
                if s.startswith(prefix, self.i):
                    self.i += len(prefix)
                    return
            if s.startswith("?<", self.i):
                end = s.find(">", self.i)
                name = s[self.i + 2 : end] if end > 0 else ""
                ident = name.replace("_", "a")
                if ident and ident[0].isalpha() and ident.isalnum():
                    self.i = end + 1
                    return
            raise self.fail("unknown group syntax '(?'")

    def _quantifier(self) -> int:
        """The repeat count a quantifier stands for (its upper bound, or its lower one when
        unbounded; a loop is one unit), advancing past it."""
        s = self.s
        c = s[self.i]
        if c != "{":
            self.i += 1
            return 1
        end = s.find("}", self.i)
        body = s[self.i + 1 : end] if end > 0 else ""
        lo_s, sep, hi_s = body.partition(",")
        if not lo_s and sep and hi_s:
            lo_s = "0"  # {,n}: llama-cpp-python's converter reads it as {0,n}
        if end < 0 or not lo_s.isdigit() or (hi_s and not hi_s.isdigit()):
            raise self.fail("'{' must start a quantifier {m}, {m,} or {m,n} (escape a literal '{')")
        if len(lo_s) > 9 or len(hi_s) > 9:
            raise InvalidRequest(
                f"'pattern' has the quantifier {{{body}}}; at most {MAX_REPEAT} repeats are "
                f"allowed",
                param=self.param,
            )
        lo, hi = int(lo_s), int(hi_s) if hi_s else None
        if hi is not None and hi < lo:
            raise self.fail(f"the quantifier {{{body}}} has its bounds out of order")
        self.i = end + 1
        return hi if hi is not None else lo

    def _char_class(self) -> None:
        s, n = self.s, len(self.s)
        start = self.i
        self.i += 1
        if self.i < n and s[self.i] == "^":
            self.i += 1
        if self.i < n and s[self.i] == "]":
            self.i += 1  # "[]a]" and "[^]a]": a leading ']' is a member
        while self.i < n and s[self.i] != "]":
            if s[self.i] == "\\":
                self._escape(in_class=True)
            else:
                self.i += 1
        if self.i >= n:
            self.i = start
            raise self.fail("unclosed character class '['")
        self.i += 1

    def _escape(self, *, in_class: bool) -> None:
        s, n = self.s, len(self.s)
        if self.i + 1 >= n:
            raise self.fail("a trailing backslash")
        c = s[self.i + 1]
        hexlen = {"x": 2, "u": 4}.get(c)
        if hexlen is not None:
            digits = s[self.i + 2 : self.i + 2 + hexlen]
            if len(digits) != hexlen or not all(d in "0123456789abcdefABCDEF" for d in digits):
                raise self.fail(f"a bad escape '\\{c}' (it needs {hexlen} hex digits)")
            self.i += 2 + hexlen
            return
        if c == "c":
            if self.i + 2 >= n or not s[self.i + 2].isascii() or not s[self.i + 2].isalpha():
                raise self.fail("a bad escape '\\c' (it needs a letter)")
            self.i += 3
            return
        if c.isascii() and c.isalnum() and c not in _CLASS_ESCAPES:
            if in_class or not c.isdigit():
                raise self.fail(f"a bad escape '\\{c}'")
        self.i += 2
