"""The GBNF measure at llama.cpp's edge (app/runtimes/grammar/gbnf.py) and the schema -> GBNF step
(app/runtimes/llama/grammar.py): pure Python, no model loaded."""

from __future__ import annotations

import json

import pytest

from app.core.inference.constraints import MAX_CHOICES, MAX_REPEAT, MAX_TOTAL_REPEAT, check_schema
from app.core.inference.tools import Tool, tool_call_constraint
from app.errors import InvalidRequest
from app.runtimes.grammar.gbnf import (
    MAX_GRAMMAR_BYTES,
    MAX_GRAMMAR_DEPTH,
    MAX_GRAMMAR_ELEMENTS,
    MAX_GRAMMAR_FANOUT,
    GrammarError,
    check_grammar,
    measure,
)
from app.runtimes.llama.grammar import grammar_for
from tests.core.inference.test_constraints import AGENT_TOOLS

pytest.importorskip("llama_cpp")


def schema_grammar(schema: dict) -> str:
    return str(grammar_for(("json_schema", json.dumps(schema))))


def test_json_object_grammar_shape() -> None:
    from llama_cpp.llama_grammar import JSON_GBNF

    shape = measure(JSON_GBNF)
    assert shape.nesting == 2 and shape.fanout < 20 and shape.chain < 10


def test_a_flat_enum_opens_one_stack_per_value() -> None:
    assert measure(schema_grammar({"enum": [f"v{i}" for i in range(100)]})).fanout == 100


def test_optional_properties_open_one_stack_each() -> None:
    props = {f"p{i}": {"type": "integer"} for i in range(50)}
    shape = measure(schema_grammar({"type": "object", "properties": props}))
    assert 50 <= shape.fanout <= 53


def test_a_count_at_the_bound_nests_that_deep_and_passes() -> None:
    for schema in (
        {"type": "string", "maxLength": MAX_REPEAT},
        {"type": "array", "items": {"type": "integer"}, "maxItems": MAX_REPEAT},
        {"type": "string", "pattern": f"^a{{0,{MAX_REPEAT}}}$"},
    ):
        shape = measure(schema_grammar(schema))
        assert MAX_REPEAT <= shape.nesting < MAX_GRAMMAR_DEPTH


def test_the_largest_schemas_the_validator_allows_make_grammars_within_the_bounds() -> None:
    n = MAX_TOTAL_REPEAT // MAX_REPEAT
    strings = {f"s{i}": {"type": "string", "maxLength": MAX_REPEAT} for i in range(n)}
    choices = {"c": {"enum": [f"value-{i}" for i in range(MAX_CHOICES)]}}
    consts = {"anyOf": [{"const": f"value-{i}"} for i in range(MAX_CHOICES)]}
    # objects all start with "{": every branch stays alive (three stacks each, counted) until
    # their keys part ways, so llama.cpp takes about 170 of them
    objects = {
        "anyOf": [
            {"type": "object", "properties": {f"k{i}": {"type": "string"}}, "required": [f"k{i}"]}
            for i in range(128)
        ]
    }
    for schema in (
        {"type": "object", "properties": strings, "required": list(strings)},
        {"type": "object", "properties": choices, "required": ["c"]},
        consts,
        objects,
        {"type": "string", "pattern": "^(a{10}){100}$"},
    ):
        check_schema(schema, param="s")
        check_grammar(schema_grammar(schema), param="response_format")


def test_real_agent_tools_forced_together_make_a_grammar_within_the_bounds() -> None:
    tools = [Tool(f"tool_{i}", "", s) for i, s in enumerate(AGENT_TOOLS)]
    grammar = grammar_for(tool_call_constraint(tools, parallel=True))
    assert grammar is not None and measure(grammar).fanout <= MAX_GRAMMAR_FANOUT


@pytest.mark.parametrize(
    ("grammar", "bound"),
    [
        ("root ::= " + '("a" ' * 2000 + ")?" * 2000, "depth"),  # llama.cpp's parser recursion
        ("root ::= " + "(" * 60_000 + '"a"' + ")" * 60_000, "depth"),  # #26600's 60,000
        (  # leading references: llama.cpp's left-recursion check and stack expansion
            "root ::= r0\n"
            + "".join(f'r{i} ::= r{i + 1} "a"\n' for i in range(MAX_GRAMMAR_DEPTH + 10))
            + f'r{MAX_GRAMMAR_DEPTH + 10} ::= "b"\n',
            "depth",
        ),
        (f'root ::= "a"{{0,{MAX_REPEAT + 1}}}', "repeat"),
        ('root ::= "a"{99999999999}', "repeat"),
        ('root ::= ("abcdefgh"{1000} "x"){1000}' + ' "yyyy"{1000}' * 300, "elements"),
        ("root ::= " + " | ".join(f'"v{i}"' for i in range(MAX_GRAMMAR_FANOUT + 1)), "fanout"),
        ('root ::= "x" root "y"?', "fanout"),  # one more open stack per level of recursion
    ],
)
def test_grammars_over_a_bound_are_refused(grammar: str, bound: str) -> None:
    with pytest.raises(GrammarError) as ei:
        measure(grammar)
    assert ei.value.bound == bound


def test_object_branches_that_stay_alive_together_add_up() -> None:
    def branches(n: int) -> dict:
        return {
            "anyOf": [
                {
                    "type": "object",
                    "properties": {f"k{i}": {"type": "string"}},
                    "required": [f"k{i}"],
                }
                for i in range(n)
            ]
        }

    assert measure(schema_grammar(branches(100))).fanout >= 200  # at least two per branch
    with pytest.raises(InvalidRequest) as ei:
        schema_grammar(branches(MAX_CHOICES))
    assert str(MAX_GRAMMAR_FANOUT) in ei.value.message


def test_alternatives_that_part_ways_count_once() -> None:
    # JSON's value: object, array, string, number... start with different characters
    from llama_cpp.llama_grammar import JSON_GBNF

    assert measure(JSON_GBNF).fanout < 20
    # forced calls: each tool's arguments come after its own name, so they never add up
    many = [Tool(f"tool_{i}", "", AGENT_TOOLS[i % len(AGENT_TOOLS)]) for i in range(128)]
    grammar = grammar_for(tool_call_constraint(many, parallel=True))
    assert grammar is not None and measure(grammar).fanout <= 2 * 128


def test_stacks_that_multiply_through_a_shared_enum_are_refused() -> None:
    # 64 branches that all read '{"k": "' and then one shared enum of 64 values: 64 x 64
    schema = {
        "$defs": {"e": {"enum": [f"v{i}" for i in range(64)]}},
        "anyOf": [
            {
                "type": "object",
                "properties": {"k": {"$ref": "#/$defs/e"}, f"x{i}": {"type": "integer"}},
                "required": ["k", f"x{i}"],
            }
            for i in range(64)
        ],
    }
    check_schema(schema, param="s")  # every count is small: only the grammar shows the product
    with pytest.raises(InvalidRequest) as ei:
        schema_grammar(schema)
    assert str(MAX_GRAMMAR_FANOUT) in ei.value.message


def test_a_fanout_that_multiplies_through_shared_rules_is_refused() -> None:
    # each level offers two ways into the next, in different places: 2**12 stacks after "["
    rules = ['leaf ::= "z"']
    prev = "leaf"
    for i in range(12):
        rules.append(f'l{i} ::= "[" {prev} "]" | "[" {prev} ")"')
        prev = f"l{i}"
    rules.append(f"root ::= {prev}")
    with pytest.raises(GrammarError) as ei:
        measure("\n".join(rules))
    assert ei.value.bound == "fanout"


@pytest.mark.parametrize(
    ("grammar", "why"),
    [
        ('root ::= "\\d"', "unknown escape"),  # what a \d pattern becomes in the converter
        ('root ::= "\\x4"', "hex digits"),
        ('root ::= "abc', "unterminated literal"),
        ("root ::= [abc", "unterminated character class"),
        ('root ::= ("a"', "expecting ')'"),
        ('root ::= "a")', "unexpected ')'"),
        ("root ::= other", "undefined rule"),
        ('r ::= "a"', "no root rule"),
        ('root ::= root "a" | "b"', "left-recursive"),
        ('root ::= * "a"', "expecting an item"),
        ('root ::= "a"{3,2}', "out of order"),
        ('root ::= <[1]> "a"', "unexpected"),
        ('root "a"', "expecting '::='"),
    ],
)
def test_malformed_grammars_are_refused_before_llama_cpp_prints_them(
    grammar: str, why: str
) -> None:
    with pytest.raises(GrammarError) as ei:
        measure(grammar)
    assert why in str(ei.value) and ei.value.bound is None


def test_syntax_llama_cpp_takes() -> None:
    grammar = (
        "# a comment\n"
        "root ::= item (\n"
        '  "," item  # another\n'
        ")* ws\n"
        "\n"
        'item ::= [a-z\\]\\-] | "\\u00e9" | "\\"" | . | "x"{2} "y"{1,} "z"{0,3} ""\n'
        'ws ::= | " " | "\\n" [ \\t]{0,20}\n'
        'item ::= "redefined" "\\t\\r\\n\\\\\\[\\]"\n'
    )
    shape = measure(grammar)
    assert shape.nesting == 1 and shape.fanout >= 2


def test_check_grammar_answers_a_400_naming_the_bound() -> None:
    with pytest.raises(InvalidRequest) as ei:
        check_grammar("root ::= " + "(" * 5000 + '"a"' + ")" * 5000, param="response_format")
    assert ei.value.param == "response_format" and str(MAX_GRAMMAR_DEPTH) in ei.value.message
    with pytest.raises(InvalidRequest) as ei:
        check_grammar('root ::= "' + "a" * MAX_GRAMMAR_BYTES + '"', param="tools")
    assert ei.value.param == "tools" and str(MAX_GRAMMAR_BYTES) in ei.value.message
    with pytest.raises(InvalidRequest) as ei:
        check_grammar('root ::= "\\d"', param="response_format")
    assert "cannot parse" in ei.value.message


def test_grammar_for_refuses_before_llama_cpp_sees_the_grammar() -> None:
    # what the converter writes for a \d pattern: llama.cpp would print the whole grammar
    with pytest.raises(InvalidRequest) as ei:
        grammar_for(("json_schema", json.dumps({"type": "string", "pattern": r"^\d+$"})))
    assert "unknown escape" in ei.value.message and ei.value.param == "response_format"
    props = {f"p{i}": {"type": "integer"} for i in range(MAX_GRAMMAR_FANOUT + 10)}
    with pytest.raises(InvalidRequest) as ei:
        grammar_for(("json_schema", json.dumps({"type": "object", "properties": props})))
    assert str(MAX_GRAMMAR_FANOUT) in ei.value.message


def test_elements_bound_is_checked_while_parsing() -> None:
    with pytest.raises(GrammarError) as ei:
        measure("root ::= " + ' "abcdefghijklmnop"{1000}' * 100)
    assert ei.value.bound == "elements" and str(MAX_GRAMMAR_ELEMENTS) in str(ei.value)
