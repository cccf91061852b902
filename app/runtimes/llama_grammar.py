"""llama.cpp grammars for output constraints: a JSON schema (or a forced tool call) becomes GBNF
through llama-cpp-python's converter, and the result is measured by
:func:`app.runtimes.gbnf.check_grammar` before llama.cpp ever parses it."""

from __future__ import annotations

import json

from app.errors import InvalidRequest
from app.runtimes.gbnf import check_grammar
from app.runtimes.guidance import MAX_PARALLEL_CALLS

_CONVERTER_ERRORS = (
    ValueError,
    KeyError,
    TypeError,
    RecursionError,
    AssertionError,
    AttributeError,
)


def grammar_for(constraint: tuple[str, str] | None) -> str | None:
    """GBNF for a response_format constraint (llama-cpp-python's JSON-schema converter), bounded
    by :func:`app.runtimes.gbnf.check_grammar` before llama.cpp ever parses it. Pure Python work
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


_GRAMMAR_CACHE: dict[tuple[str, str], str] = {}


def _build_grammar(constraint: tuple[str, str]) -> str:
    from llama_cpp.llama_grammar import JSON_GBNF, json_schema_to_gbnf

    kind, schema = constraint
    if kind == "json_object":
        return str(JSON_GBNF)
    param = "tools" if kind == "tool_call" else "response_format"
    if kind == "tool_call":  # forced tool calls, written in the hermes form
        spec = json.loads(schema)
        try:
            call = str(json_schema_to_gbnf(json.dumps(spec["schema"]), ["name", "arguments"]))
        except _CONVERTER_ERRORS as e:
            raise InvalidRequest(f"a tool's parameters cannot be enforced: {e}", param=param) from e
        body = call.replace("root ::=", "call-object ::=", 1)
        block = '"<tool_call>\\n" call-object "\\n</tool_call>"'
        # parallel: up to MAX_PARALLEL_CALLS, so a small model cannot chain calls forever
        more = f' ("\\n" {block}){{0,{MAX_PARALLEL_CALLS - 1}}}' if spec.get("parallel") else ""
        grammar = f"root ::= {block}{more}\n{body}"
    else:
        try:
            grammar = str(json_schema_to_gbnf(schema))
        except _CONVERTER_ERRORS as e:
            raise InvalidRequest(f"the JSON schema cannot be enforced: {e}", param=param) from e
    check_grammar(grammar, param=param)
    return grammar
