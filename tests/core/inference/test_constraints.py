"""The bounded schema validator (app/core/inference/constraints.py): pure, no model."""

from __future__ import annotations

import json

import pytest

from app.core.inference.constraints import (
    COUNT_KEYWORDS,
    MAX_CHOICES,
    MAX_CONSTRAINT_BYTES,
    MAX_OPTIONAL_PROPERTIES,
    MAX_PATTERN_NESTING,
    MAX_PROPERTIES,
    MAX_REPEAT,
    MAX_SCHEMA_BYTES,
    MAX_SCHEMA_COST,
    MAX_SCHEMA_DEPTH,
    MAX_TOTAL_PROPERTIES,
    MAX_TOTAL_REPEAT,
    check_pattern,
    check_schema,
    check_schemas,
    json_depth,
)
from app.errors import InvalidRequest

P = "response_format.json_schema.schema"


def refused(schema: object, param: str = P) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as ei:
        check_schema(schema, param=param)
    return ei.value


# -- the inputs of -------------------------------------------------------------------
@pytest.mark.parametrize(
    ("schema", "where", "number"),
    [
        ({"type": "string", "maxLength": 32000}, ".maxLength", "32000"),  # segfaulted llama.cpp
        (
            {"type": "array", "items": {"type": "integer"}, "minItems": 20_000_000},
            ".minItems",
            "20000000",
        ),
        ({"type": "string", "pattern": "^a{0,37000}$"}, ".pattern", "37000"),  # segfaulted too
        ({"type": "string", "pattern": "^a{200000000}$"}, ".pattern", "200000000"),  # 0.9 GB
    ],
)
def test_the_inputs_that_crashed_or_exhausted_the_server_are_refused(
    schema: dict, where: str, number: str
) -> None:
    e = refused(schema)
    assert e.param == P + where
    assert number in e.message and str(MAX_REPEAT) in e.message, "names the bound and its number"


def test_an_invalid_regex_is_refused_naming_the_parameter() -> None:
    e = refused({"type": "object", "properties": {"a": {"type": "string", "pattern": "^(a$"}}})
    assert e.param == P + ".properties.a.pattern"
    assert "not a valid regular expression" in e.message and "unclosed group" in e.message


# -- count keywords --------------------------------------------------------------------------
@pytest.mark.parametrize("key", COUNT_KEYWORDS)
def test_every_count_keyword_is_bounded_at_max_repeat(key: str) -> None:
    assert check_schema({key: MAX_REPEAT}, param=P)
    e = refused({key: MAX_REPEAT + 1})
    assert e.param == f"{P}.{key}" and f"{MAX_REPEAT + 1}" in e.message


@pytest.mark.parametrize("bad", [-1, 1.5, "10", True, float("inf")])
def test_a_count_must_be_a_non_negative_integer(bad: object) -> None:
    e = refused({"type": "string", "maxLength": bad})
    assert e.param == P + ".maxLength" and "non-negative integer" in e.message


def test_a_whole_float_count_is_taken() -> None:
    check_schema({"type": "string", "maxLength": 10.0}, param=P)


def test_a_minimum_over_its_maximum_is_refused() -> None:
    e = refused({"type": "array", "minItems": 5, "maxItems": 2})
    assert e.param == P + ".minItems" and "(5)" in e.message and "(2)" in e.message


def test_counts_add_up_to_a_total_bound_across_the_schema() -> None:
    n = MAX_TOTAL_REPEAT // MAX_REPEAT
    fields = {f"f{i}": {"type": "string", "maxLength": MAX_REPEAT} for i in range(n)}
    check_schema({"type": "object", "properties": fields}, param=P)
    fields["one_more"] = {"type": "string", "minLength": 1}
    e = refused({"type": "object", "properties": fields})
    assert str(MAX_TOTAL_REPEAT) in e.message and e.param.startswith(P + ".properties.")


def test_min_and_max_on_one_value_count_once() -> None:
    fields = {
        f"f{i}": {"type": "string", "minLength": MAX_REPEAT, "maxLength": MAX_REPEAT}
        for i in range(MAX_TOTAL_REPEAT // MAX_REPEAT)
    }
    check_schema({"type": "object", "properties": fields}, param=P)


def test_the_total_is_shared_by_the_schemas_of_one_request() -> None:
    big = {"type": "object", "properties": {"s": {"type": "string", "maxLength": MAX_REPEAT}}}
    n = MAX_TOTAL_REPEAT // MAX_REPEAT
    check_schemas([(big, f"tools[{i}]") for i in range(n)])
    with pytest.raises(InvalidRequest) as ei:
        check_schemas([(big, f"tools[{i}]") for i in range(n + 1)])
    assert ei.value.param == f"tools[{n}].properties.s.maxLength"


def test_a_property_named_like_a_keyword_is_a_name() -> None:
    schema = {
        "type": "object",
        "properties": {
            "maxLength": {"type": "integer"},
            "pattern": {"type": "string"},
            "enum": {"type": "string"},
            "description": {"type": "string", "maxLength": 20},
        },
    }
    check_schema(schema, param=P)
    # ...and the schema under such a name is still checked
    schema["properties"]["description"]["maxLength"] = 99_999
    assert refused(schema).param == P + ".properties.description.maxLength"


def test_data_is_not_read_as_schema() -> None:
    schema = {
        "type": "string",
        "default": {"pattern": "*.py", "maxLength": 99_999},
        "examples": [{"pattern": "(("}, "**/*.js"],
        "enum": [{"minItems": 10**9}],
        "const": {"pattern": "["},
    }
    check_schema(schema, param=P)


def test_a_ref_into_data_is_checked_as_the_schema_it_becomes() -> None:
    schema = {"default": {"type": "string", "maxLength": 99_999}, "$ref": "#/default"}
    assert refused(schema).param == P + ".$ref.maxLength"


def test_refs_are_followed_once_even_in_a_cycle() -> None:
    schema = {
        "$defs": {
            "node": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "maxLength": 100},
                    "children": {"type": "array", "items": {"$ref": "#/$defs/node"}},
                },
            }
        },
        "$ref": "#/$defs/node",
    }
    check_schema(schema, param=P)


def test_a_missing_ref_is_left_to_the_runtime() -> None:
    check_schema({"properties": {"a": {"$ref": "#/definitions/missing"}}}, param=P)


# -- choices, formats, size, depth -----------------------------------------------------------
@pytest.mark.parametrize("key", ["enum", "anyOf", "oneOf", "allOf"])
def test_choices_are_bounded(key: str) -> None:
    entry = (lambda i: f"v{i}") if key == "enum" else (lambda i: {"const": i})
    check_schema({key: [entry(i) for i in range(MAX_CHOICES)]}, param=P)
    e = refused({key: [entry(i) for i in range(MAX_CHOICES + 1)]})
    assert e.param == f"{P}.{key}" and str(MAX_CHOICES) in e.message


def test_an_enum_of_100_values_works() -> None:
    check_schema({"type": "string", "enum": [f"value number {i}" for i in range(100)]}, param=P)


def test_a_long_format_is_refused() -> None:
    check_schema({"type": "string", "format": "date-time"}, param=P)
    assert refused({"type": "string", "format": "x" * 65}).param == P + ".format"


def test_size_and_depth_are_bounded() -> None:
    deep: dict = {"type": "string"}
    for _ in range(MAX_SCHEMA_DEPTH):
        deep = {"type": "array", "items": deep}
    assert "deeper" in refused(deep).message
    big = {"type": "object", "description": "x" * MAX_SCHEMA_BYTES}
    assert str(MAX_SCHEMA_BYTES) in refused(big).message
    assert "must be an object" in refused(["not", "a", "schema"]).message


def test_the_schemas_of_one_request_are_bounded_in_total_size() -> None:
    one = {"type": "object", "description": "d" * (MAX_SCHEMA_BYTES - 100)}
    n = MAX_CONSTRAINT_BYTES // MAX_SCHEMA_BYTES
    with pytest.raises(InvalidRequest) as ei:
        check_schemas([(one, f"tools[{i}]") for i in range(n + 1)])
    assert str(MAX_CONSTRAINT_BYTES) in ei.value.message


def test_json_depth_is_iterative() -> None:
    v: list = []
    for _ in range(100_000):
        v = [v]
    assert json_depth(v, 40) == 41


def test_check_schema_returns_compact_json() -> None:
    s = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert json.loads(check_schema(s, param=P)) == s


# -- patterns --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "pattern",
    [
        "^[a-z0-9]{1,64}$",
        r"^\d{4}-\d{2}-\d{2}$",
        r"^(\+\d{1,3})?\d{10}$",
        r"^(?:[a-z0-9-]{1,63}\.){1,10}[a-z]{2,}$",
        r"^(?<year>\d{4})-(?=\d)(?!0)\d+$",
        r"^[\]\\\-]+$",
        "[^]]*",
        r"^\u00e9\x41\cA\/\.\*$",
        "a*?b+?c??",
        "a{,5}",  # llama-cpp-python's converter reads it as {0,5}
        "(" * MAX_PATTERN_NESTING + "a" + ")" * MAX_PATTERN_NESTING,
        f"^(a{{10}}){{{MAX_REPEAT // 10}}}$",
        "^$",
    ],
)
def test_valid_patterns_pass(pattern: str) -> None:
    check_pattern(pattern, param="p")


@pytest.mark.parametrize(
    ("pattern", "why"),
    [
        ("^(a$", "unclosed group"),
        ("^a)$", "unbalanced ')'"),
        ("^[abc$", "unclosed character class"),
        (r"^\q$", "bad escape '\\q'"),
        (r"[\1]", "bad escape '\\1'"),
        (r"\u12", "needs 4 hex digits"),
        (r"\x4", "needs 2 hex digits"),
        (r"\c1", "needs a letter"),
        ("abc\\", "trailing backslash"),
        ("*a", "nothing to repeat"),
        ("a|*", "nothing to repeat"),
        ("a**", "nothing to repeat"),
        ("a{3,2}", "out of order"),
        ("a{x}", "must start a quantifier"),
        ("x{", "must start a quantifier"),
        ("a}", "unescaped '}'"),
        ("(?P<n>a)", "unknown group syntax"),
    ],
)
def test_invalid_patterns_are_refused(pattern: str, why: str) -> None:
    with pytest.raises(InvalidRequest) as ei:
        check_pattern(pattern, param="x.pattern")
    assert ei.value.param == "x.pattern"
    assert "not a valid regular expression" in ei.value.message and why in ei.value.message


@pytest.mark.parametrize(
    "pattern",
    [
        f"a{{{MAX_REPEAT + 1}}}",
        f"a{{0,{MAX_REPEAT + 1}}}",
        f"a{{{MAX_REPEAT + 1},}}",
        "a{99999999999999999999}",
        "^(a{1000}){1000}$",  # nested quantifiers multiply
        "^((a{10}){10}){11}$",
        "((a{2}){2}){2}" * 1 + "(" * 10 + "b{10}" + "){10}" * 10,
    ],
)
def test_quantifiers_are_bounded_and_nested_ones_multiply(pattern: str) -> None:
    with pytest.raises(InvalidRequest) as ei:
        check_pattern(pattern, param="p")
    assert str(MAX_REPEAT) in ei.value.message


def test_group_nesting_is_bounded() -> None:
    deep = "(" * (MAX_PATTERN_NESTING + 1) + "a" + ")" * (MAX_PATTERN_NESTING + 1)
    with pytest.raises(InvalidRequest) as ei:
        check_pattern(deep, param="p")
    assert str(MAX_PATTERN_NESTING) in ei.value.message


def test_a_pattern_reports_its_expansion_for_the_total() -> None:
    assert check_pattern("^a{7}$", param="p") == 7
    assert check_pattern("^(a{10}){10}$", param="p") == 110  # ten groups of ten, and the ten
    assert check_pattern("^a{5}b{6}$", param="p") == 11


def test_patterns_count_toward_the_total() -> None:
    n = MAX_TOTAL_REPEAT // MAX_REPEAT
    fields = {f"f{i}": {"type": "string", "pattern": f"^a{{{MAX_REPEAT}}}$"} for i in range(n)}
    check_schema({"type": "object", "properties": fields}, param=P)
    fields["g"] = {"type": "string", "pattern": "^a{2}$"}
    assert str(MAX_TOTAL_REPEAT) in refused({"type": "object", "properties": fields}).message


def test_pattern_property_names_are_patterns() -> None:
    e = refused({"type": "object", "patternProperties": {"^(x$": {"type": "string"}}})
    assert e.param == P + ".patternProperties"


# -- real tool schemas keep working ----------------------------------------------------------
AGENT_TOOLS = [
    {  # a shell tool
        "type": "object",
        "properties": {
            "command": {"type": "string", "description": "The command to execute"},
            "timeout": {"type": "number", "description": "Optional timeout", "maximum": 600000},
            "description": {"type": "string"},
            "run_in_background": {"type": "boolean"},
        },
        "required": ["command"],
        "additionalProperties": False,
        "$schema": "http://json-schema.org/draft-07/schema#",
    },
    {  # a file edit tool
        "type": "object",
        "properties": {
            "file_path": {"type": "string"},
            "old_string": {"type": "string"},
            "new_string": {"type": "string"},
            "replace_all": {"type": "boolean", "default": False},
        },
        "required": ["file_path", "old_string", "new_string"],
    },
    {  # a todo list
        "type": "object",
        "properties": {
            "todos": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "content": {"type": "string", "minLength": 1},
                        "status": {
                            "type": "string",
                            "enum": ["pending", "in_progress", "completed"],
                        },
                        "activeForm": {"type": "string", "minLength": 1},
                    },
                    "required": ["content", "status", "activeForm"],
                },
            }
        },
        "required": ["todos"],
    },
    {  # questions to the user, with small count bounds
        "type": "object",
        "properties": {
            "questions": {
                "type": "array",
                "minItems": 1,
                "maxItems": 4,
                "items": {
                    "type": "object",
                    "properties": {
                        "question": {"type": "string"},
                        "header": {"type": "string", "maxLength": 12},
                        "options": {
                            "type": "array",
                            "minItems": 2,
                            "maxItems": 4,
                            "items": {
                                "type": "object",
                                "properties": {
                                    "label": {"type": "string"},
                                    "description": {"type": "string"},
                                },
                                "required": ["label", "description"],
                            },
                        },
                        "multiSelect": {"type": "boolean"},
                    },
                    "required": ["question", "header", "options", "multiSelect"],
                },
            }
        },
        "required": ["questions"],
    },
    {  # fetch a page
        "type": "object",
        "properties": {"url": {"type": "string", "format": "uri"}, "prompt": {"type": "string"}},
        "required": ["url", "prompt"],
    },
    {  # search files: a property *named* pattern, with examples that are not regexes
        "type": "object",
        "properties": {
            "pattern": {"type": "string", "examples": ["**/*.py", "*.{ts,tsx}"]},
            "path": {"type": "string"},
            "output_mode": {"type": "string", "enum": ["content", "files_with_matches", "count"]},
            "-A": {"type": "number"},
            "-i": {"type": "boolean"},
        },
        "required": ["pattern"],
    },
    {  # pydantic-style: $defs, $ref, Optional as anyOf with null, a pattern and a default
        "$defs": {
            "Priority": {"enum": ["low", "high"], "title": "Priority", "type": "string"},
        },
        "properties": {
            "name": {"pattern": "^[A-Za-z0-9_-]{1,64}$", "title": "Name", "type": "string"},
            "priority": {"$ref": "#/$defs/Priority", "default": "low"},
            "due": {"anyOf": [{"type": "string", "format": "date"}, {"type": "null"}]},
            "labels": {"items": {"type": "string"}, "maxItems": 20, "type": "array"},
        },
        "required": ["name"],
        "title": "CreateTask",
        "type": "object",
    },
]


def test_real_agent_tool_schemas_pass_together() -> None:
    check_schemas((s, f"tools[{i}].function.parameters") for i, s in enumerate(AGENT_TOOLS))


# -- the converter's work: properties, optional ones, rule names ------------------------------
def _props(n: int, name: object = "p{}".format, required: int = 0) -> dict[str, object]:
    names = [name(i) for i in range(n)]  # type: ignore[operator]
    return {
        "type": "object",
        "properties": {k: {"type": "string"} for k in names},
        "required": names[:required],
    }


def test_optional_properties_are_bounded_before_conversion() -> None:
    five = {
        "type": "object",
        "properties": {f"o{j}": {"type": "object", "properties": {f"p{i}": {} for i in range(950)}}
                       for j in range(5)},
    }  # fmt: skip
    e = refused(five)  # took 6-10 s of the converter's CPU before its grammar was refused
    assert "optional properties" in e.message and e.param.endswith(".properties")
    check_schema(_props(MAX_OPTIONAL_PROPERTIES), param=P)
    e = refused(_props(MAX_OPTIONAL_PROPERTIES + 1))
    assert str(MAX_OPTIONAL_PROPERTIES) in e.message and e.param == P + ".properties"
    # required properties cost the converter little: many more of them pass
    check_schema(_props(MAX_PROPERTIES, required=MAX_PROPERTIES), param=P)
    e = refused(_props(MAX_PROPERTIES + 1, required=MAX_PROPERTIES + 1))
    assert str(MAX_PROPERTIES) in e.message


def test_the_conversion_cost_adds_up_over_objects_and_tools() -> None:
    four = {"type": "object", "properties": {f"o{j}": _props(128) for j in range(4)}}
    check_schema(four, param=P)
    with pytest.raises(InvalidRequest) as ei:
        check_schemas([(_props(200), f"tools[{i}].function.parameters") for i in range(4)])
    assert str(MAX_SCHEMA_COST) in ei.value.message
    assert ei.value.param.startswith("tools[") and ei.value.param.endswith(".properties")


def test_properties_are_bounded_in_total_across_a_request() -> None:
    one = _props(MAX_PROPERTIES, required=MAX_PROPERTIES)
    n = MAX_TOTAL_PROPERTIES // MAX_PROPERTIES
    check_schemas([(one, f"tools[{i}]") for i in range(n)])
    with pytest.raises(InvalidRequest) as ei:
        check_schemas([(one, f"tools[{i}]") for i in range(n + 1)])
    assert str(MAX_TOTAL_PROPERTIES) in ei.value.message


def test_long_rule_names_and_same_named_properties_raise_the_cost() -> None:
    # the converter names rules by path, and probes name0, name1... for names it escapes alike
    deep = {"type": "object", "properties": {"q" * 4000: _props(128)}}
    assert "optional properties" in refused(deep).message
    same = _props(128, name=lambda i: chr(0x4E00 + i))  # all escape to "-"
    assert "optional properties" in refused(same).message
    check_schema(_props(128), param=P)


def test_all_of_components_count_as_one_object() -> None:
    parts = [{"anyOf": [_props(100, name=f"c{j}_{{}}".format)]} for j in range(3)]
    e = refused({"allOf": parts})
    assert "300 optional properties" in e.message


def test_a_recursive_schema_is_counted_once() -> None:
    node = {
        "type": "object",
        "properties": {"v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#"}}},
    }
    check_schema(node, param=P)
