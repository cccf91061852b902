"""What a request's tools are and how they reach the model: the tool spec, the call format a
chat template teaches (its family), the generic prompt for templates without tools, and the
constraint that forces a valid call.

Families (detected from the chat template, overridable per model):
- ``hermes``: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (Hermes, Qwen 2/2.5/3,
  and Hearth's generic prompt for templates without tools)
- ``llama3``: a bare JSON object ``{"name": ..., "parameters": {...}}`` or ``<|python_tag|>...``
- ``mistral``: ``[TOOL_CALLS][{"name": ..., "arguments": {...}}]``, or ``[TOOL_CALLS]NAME[ARGS]{...}``
  (tokenizer v11+, Devstral)
- ``qwen3coder``: ``<tool_call><function=NAME><parameter=K>V</parameter></function></tool_call>``
- ``harmony`` (gpt-oss): ``<|channel|>commentary to=functions.NAME ... <|message|>{...}<|call|>``
- ``deepseek``: ``<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\\n```json\\n{...}\\n```<｜tool▁call▁end｜>``
  (V3/R1) or ``<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}<｜tool▁call▁end｜>`` (V3.1)
- ``glm`` (GLM 4.5/4.6): ``<tool_call>NAME\\n<arg_key>K</arg_key>\\n<arg_value>V</arg_value>\\n</tool_call>``
- ``kimi`` (Kimi K2): ``<|tool_call_begin|>functions.NAME:0<|tool_call_argument_begin|>{...}<|tool_call_end|>``
- ``granite`` (Granite 3.x): ``<|tool_call|>[{"name": ..., "arguments": {...}}]``
Tested by tests/core/inference/tools/test_parser.py and tests/core/inference/test_reasoning.py.
"""

from __future__ import annotations

import json
from typing import Any

from app.core.types import Constraint, Tool

FAMILIES = (
    "hermes",
    "llama3",
    "mistral",
    "qwen3coder",
    "harmony",
    "deepseek",
    "glm",
    "kimi",
    "granite",
)

GENERIC_TOOL_PROMPT = (
    "You can call functions. The available functions, as JSON schemas:\n{tools}\n\n"
    "To call a function, answer with one block per call, exactly:\n"
    '<tool_call>\n{{"name": "<function name>", "arguments": {{<arguments as JSON>}}}}\n</tool_call>\n'
    "Call a function only when it helps; otherwise answer normally."
)


def detect_family(template: str | None) -> str:
    """The tool-call format a chat template teaches its model (hermes when unsure)."""
    t = template or ""
    if "<function=" in t and "<parameter=" in t:
        return "qwen3coder"
    if "<arg_key>" in t:  # GLM's template has <tool_call> too
        return "glm"
    if "<tool_call>" in t:
        return "hermes"
    if "<|tool_call_begin|>" in t or "<|tool_calls_section_begin|>" in t:
        return "kimi"
    if "<|tool_call|>" in t:
        return "granite"
    if "[TOOL_CALLS]" in t:
        return "mistral"
    if "<|python_tag|>" in t or ("ipython" in t and "<|eot_id|>" in t):
        return "llama3"
    if "<|channel|>" in t or "<|call|>" in t:
        return "harmony"
    if "tool▁call▁begin" in t or "tool▁calls▁begin" in t:
        return "deepseek"
    return "hermes"


def template_handles_tools(template: str | None) -> bool:
    return bool(template) and "tools" in (template or "")


def generic_tool_prompt(tools: list[Tool]) -> str:
    return GENERIC_TOOL_PROMPT.format(tools="\n".join(json.dumps(t.as_openai()) for t in tools))


def tool_call_constraint(tools: list[Tool], *, parallel: bool) -> Constraint:
    """A constraint that forces hermes-style calls: the call object's JSON schema (one
    alternative per tool, arguments by that tool's own schema) for the runtime to compile."""
    alternatives = []
    for i, t in enumerate(tools):
        params = t.parameters or {}
        if _takes_nothing(params):
            params = {"type": "object", "properties": {}, "additionalProperties": False}
        # a tool's local $refs point into its own schema, which now sits inside the call object
        here = "#/properties/arguments" if len(tools) == 1 else f"#/oneOf/{i}/properties/arguments"
        params = _rebase_refs(params, here)
        alternatives.append(
            {
                "type": "object",
                "properties": {"name": {"const": t.name}, "arguments": params},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
        )
    schema = alternatives[0] if len(alternatives) == 1 else {"oneOf": alternatives}
    return Constraint("tool_call", json.dumps({"schema": schema, "parallel": parallel}))


# keywords that say nothing about what an object holds
_NOTES = frozenset({"type", "properties", "required", "title", "description", "$schema", "$id"})


def _takes_nothing(params: dict[str, Any]) -> bool:
    """Whether a tool's parameter schema is an object with no properties and nothing else that
    shapes its arguments (``{}``, ``{"type": "object"}``): its calls take ``{}``. A schema whose
    root is ``anyOf``, ``oneOf``, ``allOf`` or a ``$ref`` (as pydantic and zod write them) has no
    root ``properties`` either, and is enforced as it is."""
    return (
        params.get("type", "object") == "object"
        and not params.get("properties")
        and params.get("additionalProperties", False) is False
        and set(params) <= _NOTES | {"additionalProperties"}
    )


def _rebase_refs(schema: dict[str, Any], base: str) -> dict[str, Any]:
    """A copy of ``schema`` whose local ``$ref`` pointers (``#...``) start at ``base``."""
    out: dict[str, Any] = json.loads(json.dumps(schema))
    stack: list[Any] = [out]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#"):
                node["$ref"] = base + ref[1:]
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return out
