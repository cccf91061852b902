"""llama.cpp grammars for output constraints: a JSON schema (or a forced tool call) becomes GBNF
through llama-cpp-python's converter, and the result is measured by
:func:`app.runtimes.grammar.gbnf.check_grammar` before llama.cpp ever parses it.
Tested by tests/runtimes/grammar/test_gbnf.py and tests/runtimes/grammar/test_limits.py."""

from __future__ import annotations

import json
from typing import Any

from app.core.types import Constraint
from app.errors import InvalidRequest
from app.runtimes.grammar.gbnf import check_grammar
from app.runtimes.grammar.guidance import MAX_PARALLEL_CALLS

_CONVERTER_ERRORS = (
    ValueError,
    KeyError,
    TypeError,
    RecursionError,
    AssertionError,
    AttributeError,
)


def grammar_for(constraint: Constraint | None) -> str | None:
    """GBNF for a response_format constraint (llama-cpp-python's JSON-schema converter), bounded
    by :func:`app.runtimes.grammar.gbnf.check_grammar` before llama.cpp ever parses it. Pure Python work
    that can take a while on a large schema: call it off the event loop.

    Raises:
        InvalidRequest: the schema cannot be converted (unsupported keywords, bad refs...), or
            its grammar crosses a bound.
    """
    if constraint is None:
        return None
    g = _GRAMMAR_CACHE.get(constraint)
    if g is None:
        g = _build_grammar(constraint)
        if len(_GRAMMAR_CACHE) > 256:
            _GRAMMAR_CACHE.clear()
        _GRAMMAR_CACHE[constraint] = g
    return g


_GRAMMAR_CACHE: dict[Constraint, str] = {}


def _build_grammar(constraint: Constraint) -> str:
    from llama_cpp.llama_grammar import JSON_GBNF

    kind, schema = constraint
    if kind == "json_object":
        return str(JSON_GBNF)
    param = "tools" if kind == "tool_call" else "response_format"
    if kind == "tool_call":  # forced tool calls, written in the hermes form
        spec = json.loads(schema)
        try:
            body = _call_object(spec["schema"])
        except _CONVERTER_ERRORS as e:
            raise InvalidRequest(
                f"a tool's parameters cannot be enforced: {_short(e)}", param=param
            ) from e
        block = '"<tool_call>\\n" call-object "\\n</tool_call>"'
        # parallel: up to MAX_PARALLEL_CALLS, so a small model cannot chain calls forever
        more = f' ("\\n" {block}){{0,{MAX_PARALLEL_CALLS - 1}}}' if spec.get("parallel") else ""
        grammar = f"root ::= {block}{more}\n{body}"
    else:
        try:
            conv = _converter()
            conv.visit(_with_refs(conv, json.loads(schema), "input"), "")
            grammar = str(conv.format_grammar())
        except _CONVERTER_ERRORS as e:
            raise InvalidRequest(
                f"the JSON schema cannot be enforced: {_short(e)}", param=param
            ) from e
    check_grammar(grammar, param=param)
    return grammar


def _call_object(schema: dict[str, Any]) -> str:
    """The rules of ``call-object``: ``{"name": ..., "arguments": ...}`` for the tools of
    :func:`app.core.inference.tools.tool_call_constraint`'s schema, the name first and each tool's
    arguments after its own name. Written so (not as one alternative per whole call) because
    llama.cpp keeps every alternative that matches the text so far alive: whole calls share
    their beginning, so each tool's arguments would open their stacks at once."""
    conv = _converter()
    many = "oneOf" in schema
    calls = schema["oneOf"] if many else [schema]
    branches = []
    for i, call in enumerate(calls):
        name = call["properties"]["name"]["const"]
        # the converter resolves refs within the schema it is given (and not through lists):
        # give each tool its own arguments back as the root of its refs
        base = f"#/oneOf/{i}/properties/arguments" if many else "#/properties/arguments"
        own = _with_refs(conv, _unbase_refs(call["properties"]["arguments"], base), f"tool{i}")
        args = conv.visit(own, f"tool-{i}-arguments")
        branches.append(
            f'{_literal(json.dumps(name))} space "," space "\\"arguments\\"" space ":" space {args}'
        )
    head = '"{" space "\\"name\\"" space ":" space'
    rules = str(conv.format_grammar())
    return f'call-object ::= {head} ( {" | ".join(branches)} ) "}}" space\n{rules}'


# A character of a JSON string. llama-cpp-python's converter writes ``[^"\\]``, which lets a
# raw newline or tab into a string: invalid JSON (strict parsers such as pydantic's refuse it),
# and small models write one often. RFC 8259 excludes U+0000-U+001F; DEL is excluded as
# llama.cpp's own converter does.
JSON_CHAR = r'[^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4})'


def _converter() -> Any:
    from llama_cpp.llama_grammar import BuiltinRule, SchemaConverter

    class Converter(SchemaConverter):  # type: ignore[misc]
        def _add_primitive(self, name: str, rule: Any) -> Any:
            return super()._add_primitive(
                name, BuiltinRule(JSON_CHAR, []) if name == "char" else rule
            )

    return Converter(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)


def _with_refs(conv: Any, schema: Any, url: str) -> Any:
    """``schema`` with every local ``$ref`` registered with the converter (as ``url#/...``).

    The converter's own pass (``resolve_refs``) stops at a node with a ``$ref``: the ``$defs``
    beside a root ``$ref`` (a pydantic model's schema) and the refs inside a ref's target were
    never registered, and converting them failed with a bare ``KeyError: '#/$defs/Node'``. Its
    ``_refs`` table is filled here instead (llama-cpp-python is pinned); a recursive ref then
    converts into a recursive rule, which the converter supports.

    Raises:
        ValueError: a ref that is not local, or that points at nothing.
    """
    refs: dict[str, Any] = conv._refs
    seen: set[int] = set()
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
            continue
        if not isinstance(node, dict) or id(node) in seen:
            continue
        seen.add(id(node))
        ref = node.get("$ref")
        if isinstance(ref, str) and not ref.startswith(url + "#"):
            if ref != "#" and not ref.startswith("#/"):
                raise ValueError(f"'$ref' {ref!r} is not supported: only local refs ('#/...')")
            target = _pointer(schema, ref)
            if not isinstance(target, dict):
                raise ValueError(f"'$ref' {ref!r} points at no schema")
            node["$ref"] = url + ref
            refs[url + ref] = target
        stack.extend(v for k, v in node.items() if k not in ("enum", "const", "default"))
    return schema


def _pointer(root: Any, ref: str) -> Any:
    node = root
    for part in ref[2:].split("/") if ref != "#" else []:
        key = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and key in node:
            node = node[key]
        elif isinstance(node, list) and key.isdigit() and int(key) < len(node):
            node = node[int(key)]
        else:
            return None
    return node


def _literal(text: str) -> str:
    """``text`` as a GBNF literal (it is JSON already: no raw control characters)."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _unbase_refs(schema: Any, base: str) -> Any:
    """``schema`` with the local ``$ref`` pointers under ``base`` made relative to itself."""
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and (ref == base or ref.startswith(base + "/")):
                node["$ref"] = "#" + ref[len(base) :]
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return schema


def _short(e: Exception) -> str:
    """The converter's message, without the whole schema it may quote."""
    text = str(e) or type(e).__name__
    return text if len(text) <= 300 else text[:300] + "..."
