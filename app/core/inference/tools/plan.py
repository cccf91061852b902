"""How one chat request's tools reach the model (its template's tool support, or a generic
prompt; a grammar for a forced call) and come back as calls.
Tested by tests/core/inference/tools/test_parser.py, tests/core/inference/tools/test_offered.py
and tests/core/inference/test_reasoning.py."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from app.core.inference.tools.spec import (
    Tool,
    detect_family,
    generic_tool_prompt,
    template_handles_tools,
    tool_call_constraint,
)
from app.core.types import ChatMessage, Constraint, LoadedModel
from app.core.util import jsonsafe
from app.errors import InvalidRequest


@dataclass
class ToolSetup:
    """How one chat request's tools reach the model and come back as calls."""

    messages: Sequence[ChatMessage]
    family: str = "hermes"
    active: bool = False
    template_tools: list[dict[str, Any]] | None = None
    constraint: Constraint | None = None
    max_calls: int | None = None  # the generation ends once this many calls are out
    # forced calls end at the first repeat: a grammar-bound small model tends to loop on a call
    end_on_repeat: bool = False
    # the offered tools' names: a call of any other tool comes back as text (unknown_tool)
    names: frozenset[str] | None = None

    @classmethod
    def plan(
        cls,
        lm: LoadedModel,
        preset: Mapping[str, Any],
        messages: Sequence[ChatMessage],
        tools: Sequence[Tool],
        tool_choice: str,
        parallel: bool,
    ) -> ToolSetup:
        if not tools or tool_choice == "none":
            return cls(
                _plain_history(messages)
                if not template_handles_tools(lm.chat_template)
                else messages
            )
        if tool_choice not in ("auto", "required"):
            tools = [t for t in tools if t.name == tool_choice]
            if not tools:
                raise InvalidRequest(
                    f"tool_choice names '{tool_choice}', which is not in tools", param="tool_choice"
                )
        native = template_handles_tools(lm.chat_template)
        family = str(
            preset.get("tool_format") or (detect_family(lm.chat_template) if native else "hermes")
        )
        # parallel_tool_calls false (Anthropic's disable_parallel_tool_use): at most one call
        constraint, max_calls = None, (None if parallel else 1)
        if tool_choice != "auto":
            # forced: a grammar makes the output a well-formed call of an allowed tool, written
            # in the hermes form that the parser below reads back; a named choice is one call
            family = "hermes"
            single = tool_choice != "required" or not parallel
            constraint = tool_call_constraint(list(tools), parallel=not single)
            max_calls = 1 if single else None
        forced = tool_choice != "auto"
        names = frozenset(t.name for t in tools)
        if native:
            tools_json = [t.as_openai() for t in tools]
            return cls(messages, family, True, tools_json, constraint, max_calls, forced, names)
        prompt = generic_tool_prompt(list(tools))
        history = _plain_history(messages)
        if history and history[0].role == "system":
            history = [ChatMessage("system", history[0].content + "\n\n" + prompt), *history[1:]]
        else:
            history = [ChatMessage("system", prompt), *history]
        return cls(history, family, True, None, constraint, max_calls, forced, names)


def _plain_history(messages: Sequence[ChatMessage]) -> list[ChatMessage]:
    """Tool turns as plain text, for templates that know no tool role."""
    out = []
    for m in messages:
        if m.role == "tool":
            out.append(ChatMessage("user", f"<tool_response>\n{m.content}\n</tool_response>"))
        elif m.role == "assistant" and m.tool_calls:
            blocks = [
                "<tool_call>\n"
                + json.dumps({"name": c.name, "arguments": _maybe_json(c.arguments)})
                + "\n</tool_call>"
                for c in m.tool_calls
            ]
            out.append(
                ChatMessage(
                    "assistant", (m.content + "\n" if m.content else "") + "\n".join(blocks)
                )
            )
        else:
            out.append(m)
    return out


def _maybe_json(v: Any) -> Any:
    if isinstance(v, str):
        try:
            return jsonsafe.loads(v)
        except ValueError:
            return v
    return v
